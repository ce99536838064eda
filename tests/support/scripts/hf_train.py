"""A Hugging Face ``Trainer`` script as a user would write it (CPU; runs alone or under torchrun / hpc-train).

A tiny GPT-2 built from its config (no download) learns a synthetic token sequence. Nothing in it
knows hpc_train: under ``hpc-train strategy=ddp resources.gpus_per_node=2 -- hf_train.py ...`` the
Trainer finds torchrun's variables (RANK, WORLD_SIZE, MASTER_ADDR, ...) and trains with DDP over
gloo. Each rank writes what it saw to ``<output_dir>/rank<R>.json`` (its environment, the
Trainer's world, the number of samples it trained on, a checksum of its final weights), which the
test reads.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
from pathlib import Path

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments

try:  # hpc_train's metrics helper, if installed: rank 0 appends to the run dir's metrics.jsonl (a no-op elsewhere)
    from hpc_train import log_metrics
except ImportError:  # pragma: no cover - the script runs without hpc_train too

    def log_metrics(step, **metrics):
        return None


ENV_KEYS = (
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "NODE_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
    "OMP_NUM_THREADS",
    "HPC_TRAIN_RUN_DIR",
    "HPC_TRAIN_ATTEMPT",
)


class Tokens(torch.utils.data.Dataset):
    """`size` windows of a repeating token pattern; the Trainer's sampler shards them over the ranks."""

    def __init__(self, size: int, length: int, vocab: int) -> None:
        self.size, self.length, self.vocab = size, length, vocab
        self.seen = []  # the indices this rank was given, in order

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int):
        self.seen.append(int(index))
        ids = (torch.arange(self.length) * 3 + index) % self.vocab
        return {"input_ids": ids, "labels": ids.clone()}


class ToHpcTrain(TrainerCallback):
    """The Trainer's logged loss, also in hpc_train's metrics.jsonl (its summary.json and hpc-train-report read it)."""

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs and "loss" in logs:
            log_metrics(step=state.global_step, loss=float(logs["loss"]))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--output_dir", required=True)
    parser.add_argument("--samples", type=int, default=32)
    parser.add_argument("--batch_size", type=int, default=4, help="per device")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--lr", type=float, default=1e-3)
    args = parser.parse_args()

    torch.manual_seed(0)
    config = GPT2Config(vocab_size=32, n_positions=16, n_embd=16, n_layer=1, n_head=2, bos_token_id=0, eos_token_id=0)
    model = GPT2LMHeadModel(config)
    initial = float(sum(p.detach().double().sum() for p in model.parameters()))
    data = Tokens(args.samples, 16, 32)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    training_args = TrainingArguments(
        output_dir=args.output_dir,
        use_cpu=True,
        ddp_backend="gloo" if world > 1 else None,
        ddp_find_unused_parameters=False,
        per_device_train_batch_size=args.batch_size,
        num_train_epochs=args.epochs,
        learning_rate=args.lr,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
        dataloader_num_workers=0,
        seed=0,
    )
    trainer = Trainer(model=model, args=training_args, train_dataset=data, callbacks=[ToHpcTrain()])
    result = trainer.train()
    trainer.save_state()  # trainer_state.json (rank 0)

    import torch.distributed as dist

    checksum = float(sum(p.detach().double().sum() for p in trainer.model.parameters()))
    record = {
        "env": {key: os.environ.get(key) for key in ENV_KEYS},
        "args_world_size": training_args.world_size,
        "process_index": training_args.process_index,
        "parallel_mode": str(training_args.parallel_mode),
        "dist_world_size": dist.get_world_size() if dist.is_initialized() else 1,
        "dist_backend": dist.get_backend() if dist.is_initialized() else None,
        "wrapped": type(trainer.model_wrapped).__name__,
        "global_step": result.global_step,
        "train_loss": result.training_loss,
        "samples_seen": sorted(data.seen),
        "initial_checksum": initial,
        "checksum": checksum,
    }
    Path(args.output_dir, f"rank{training_args.process_index}.json").write_text(json.dumps(record, indent=1))
    print(
        f"hf_train: rank {training_args.process_index} done, global_step {result.global_step}, loss "
        f"{result.training_loss:.4f}"
    )
    # Free the DDP model before the process group goes: with gloo, a group torn down at interpreter exit while
    # a DDP reducer still holds it can abort a finished rank ("terminate called without an active exception").
    trainer.accelerator.free_memory()
    del trainer, model
    gc.collect()
    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
