"""A Lightning script as a user would write it: ``Trainer(accelerator="cpu", devices=2, strategy="ddp")``.

A linear regression on synthetic data. Nothing in it knows hpc_train: under Slurm, Lightning finds
its ranks in SLURM_PROCID / SLURM_LOCALID / SLURM_NTASKS (its SLURMEnvironment), installs its
SIGUSR1 handler (an ``hpc_ckpt_<n>.ckpt`` in ``default_root_dir``, then ``scontrol requeue``) and,
when the requeued job starts again, restores that checkpoint by itself (or from
``--ckpt_path=hpc``). Outside Slurm it takes torchrun's variables (RANK, LOCAL_RANK, WORLD_SIZE).

Each rank appends what it saw to ``<root_dir>/rank<R>.jsonl``: at the start of training (the
cluster environment Lightning chose, its ranks, the step it starts from) and at the end (the
final step and epoch, a checksum of the weights). ``--step_sleep`` slows every step, so that a
test can signal the job mid-run.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import time
from pathlib import Path

import lightning as L
import torch
from torch.utils.data import DataLoader, TensorDataset

try:  # hpc_train's metrics helper, if installed: rank 0 appends to the run dir's metrics.jsonl (a no-op elsewhere)
    from hpc_train import log_metrics
except ImportError:  # pragma: no cover - the script runs without hpc_train too

    def log_metrics(step, **metrics):
        return None


class Regression(L.LightningModule):
    def __init__(self, lr: float) -> None:
        super().__init__()
        self.lr = lr
        self.layer = torch.nn.Linear(8, 1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.layer(x), y)
        self.log("loss", loss)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.lr)


class Record(L.Callback):
    """What this rank saw, one JSON line per event, in <root_dir>/rank<R>.jsonl; a pause after every step."""

    def __init__(self, root: Path, step_sleep: float) -> None:
        self.root, self.step_sleep = root, step_sleep

    def write(self, trainer: L.Trainer, event: str, **fields) -> None:
        env = trainer._accelerator_connector.cluster_environment
        record = {
            "event": event,
            "attempt": os.environ.get("HPC_TRAIN_ATTEMPT"),
            "pid": os.getpid(),
            "cluster_environment": type(env).__name__,
            "global_rank": trainer.global_rank,
            "local_rank": trainer.local_rank,
            "node_rank": trainer.node_rank,
            "world_size": trainer.world_size,
            "global_step": trainer.global_step,
            "epoch": trainer.current_epoch,
            "env": {
                k: os.environ.get(k)
                for k in (
                    "RANK",
                    "LOCAL_RANK",
                    "WORLD_SIZE",
                    "SLURM_PROCID",
                    "SLURM_LOCALID",
                    "SLURM_NTASKS",
                    "SLURM_RESTART_COUNT",
                    "MASTER_PORT",
                )
            },
            **fields,
        }
        with open(self.root / f"rank{trainer.global_rank}.jsonl", "a") as handle:
            handle.write(json.dumps(record) + "\n")

    def on_train_start(self, trainer, pl_module) -> None:
        self.write(trainer, "start", ckpt_path=trainer.ckpt_path)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if trainer.is_global_zero:
            log_metrics(step=trainer.global_step, loss=float(outputs["loss"]))
        time.sleep(self.step_sleep)

    def on_train_end(self, trainer, pl_module) -> None:
        checksum = float(sum(p.detach().double().sum() for p in pl_module.parameters()))
        self.write(trainer, "end", checksum=checksum)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--root_dir", required=True, help="Lightning's default_root_dir (its hpc checkpoints)")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--samples", type=int, default=64)
    parser.add_argument("--batch_size", type=int, default=4, help="per device")
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--step_sleep", type=float, default=0.0)
    parser.add_argument("--ckpt_path", default=None, help="e.g. hpc: resume from the newest hpc_ckpt_<n>.ckpt")
    args = parser.parse_args()

    root = Path(args.root_dir)
    root.mkdir(parents=True, exist_ok=True)
    L.seed_everything(0, verbose=False)
    x = torch.randn(args.samples, 8)
    y = x @ torch.arange(8.0).unsqueeze(1) / 8
    data = DataLoader(TensorDataset(x, y), batch_size=args.batch_size)
    trainer = L.Trainer(
        accelerator="cpu",
        devices=2,
        strategy="ddp",
        max_epochs=args.epochs,
        default_root_dir=str(root),
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[Record(root, args.step_sleep)],
    )
    trainer.fit(Regression(args.lr), data, ckpt_path=args.ckpt_path)
    if trainer.is_global_zero:
        print(f"lightning_train: done, global_step {trainer.global_step}, epoch {trainer.current_epoch}")
    # Free the DDP model before the process group goes (gloo can abort a finished rank at exit otherwise).
    del trainer
    gc.collect()
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
