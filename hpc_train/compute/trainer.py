"""The training loop every strategy and launcher shares.

`trainer.batch_size` is the global batch of one optimizer step: each of the W data-parallel
ranks gets batch_size / W samples. Rank 0 alone writes metrics.jsonl, summary.json and the
checkpoints (see hpc_train.compute.resume), every `trainer.checkpoint_every` steps, when a
stop signal arrives (hpc_train.compute.interrupts) and at the end.
"""

from __future__ import annotations

import gc
import hashlib
import logging
import math
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, Optional

import numpy as np
import torch
import torch.nn as nn

from hpc_train.compute import attempts, distributed, faults
from hpc_train.compute.checkpoint import save_atomic
from hpc_train.compute.data import eval_loader, train_loader
from hpc_train.compute.interrupts import NONE, StopWatch, TrainingInterrupted
from hpc_train.compute.loggers import metrics_writer
from hpc_train.compute.precision import grad_scaler
from hpc_train.compute.ranks import RankInfo
from hpc_train.compute.resume import Checkpointer
from hpc_train.compute.runlog import Progress, truncate_metrics, write_json_atomic
from hpc_train.compute.strategies import Strategy
from hpc_train.compute.user_code import build_datasets, build_loss, build_model, check_fit, collate

log = logging.getLogger("hpc_train")


@dataclass
class TrainState:
    epoch: int = 0          # epoch in progress
    step_in_epoch: int = 0  # optimizer steps already taken in that epoch
    global_step: int = 0
    last_loss: Optional[float] = None
    last_eval: Optional[Dict[str, float]] = field(default=None)


def parameter_digest(model: nn.Module) -> str:
    """SHA-256 over every parameter and buffer, in order: equal digests mean bit-identical weights."""
    digest = hashlib.sha256()
    for name, tensor in model.state_dict().items():
        digest.update(name.encode())
        digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % (2**32))
    torch.manual_seed(seed)


def make_optimizer(cfg, params) -> torch.optim.Optimizer:
    if cfg.optimizer == "sgd":
        return torch.optim.SGD(params, lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay)
    return torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)


def lr_factor(cfg, total_steps: int):
    """Multiplier of the base LR at a given step: linear warm-up, then constant/cosine/step."""
    warmup = int(cfg.lr_warmup_steps)

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        if cfg.lr_schedule == "cosine":
            progress = (step - warmup) / max(1, total_steps - warmup)
            return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))
        if cfg.lr_schedule == "step":
            return float(cfg.lr_step_gamma) ** ((step - warmup) // int(cfg.lr_step_every))
        return 1.0

    return factor


def total_steps(trainer_cfg, steps_per_epoch: int) -> int:
    bounds = []
    if trainer_cfg.epochs is not None:
        bounds.append(int(trainer_cfg.epochs) * steps_per_epoch)
    if trainer_cfg.max_steps is not None:
        bounds.append(int(trainer_cfg.max_steps))
    return min(bounds)


def settle_garbage_collector() -> None:
    """Collect once, then freeze everything set up so far (torch, model, data, config).

    Setup leaves hundreds of thousands of long-lived Python objects; without this, Python's
    full (generation 2) collection fires once they pile up, in the middle of training, and
    walks all of them (about 0.1 s per pass on a 2-core VM, 1-2 % of a short CPU run). Frozen
    objects are skipped by every later collection; garbage made during training is still freed.
    """
    gc.collect()
    gc.freeze()


class Trainer:
    def __init__(self, cfg, ranks: RankInfo, strategy: Strategy, run_dir: Path, stop_watch: Optional[StopWatch] = None) -> None:
        self.cfg = cfg
        self.tcfg = cfg.trainer
        self.ranks = ranks
        self.strategy = strategy
        self.run_dir = run_dir
        self.is_main = ranks.is_main
        self.metrics = metrics_writer(cfg, run_dir, enabled=self.is_main)  # metrics.jsonl (+ TensorBoard with logger=tensorboard)
        self.state = TrainState()
        self.stop_watch = stop_watch
        self.resumed_from_step: Optional[int] = None

        seed_everything(int(cfg.seed))  # identical initial weights on every rank
        data = build_datasets(cfg.data)
        self.data = data
        dp_size, dp_rank = strategy.data_parallel_size, strategy.data_parallel_rank
        self.per_rank_batch = int(self.tcfg.batch_size) // dp_size
        self.train_loader = train_loader(data.train, cfg.data, self.per_rank_batch, dp_size, dp_rank, seed=int(cfg.seed), collate_fn=data.collate_fn)
        self.eval_loader = eval_loader(data.val, cfg.data, self.per_rank_batch, dp_size, dp_rank, collate_fn=data.collate_fn) if data.val is not None else None
        self.steps_per_epoch = len(self.train_loader)
        if self.steps_per_epoch == 0:
            raise ValueError(
                f"trainer.batch_size={self.tcfg.batch_size} is larger than the training set ({len(data.train)} samples): "
                "lower trainer.batch_size."
            )
        self.total_steps = total_steps(self.tcfg, self.steps_per_epoch)

        model = build_model(cfg)
        self.loss_fn = strategy.loss_fn = build_loss(cfg)
        check_fit(model, self.loss_fn, data)  # a dataset the model cannot take is refused before any step
        if self.tcfg.channels_last:
            model = model.to(memory_format=torch.channels_last)
        example = None
        if strategy.needs_example:  # decoding a batch costs time on image folders: only when asked
            example = collate(data, range(min(len(data.train), self.per_rank_batch)))[0]
        self.model = self.wrapped = strategy.wrap(model, example)
        if self.tcfg.compile and strategy.supports_compile:
            self.model = torch.compile(self.model)
        elif self.tcfg.compile:
            log.warning("trainer.compile is ignored for %s: its schedule runs the stage module itself", self.cfg.strategy.name)
        self.optimizer = make_optimizer(self.tcfg, self.model.parameters())
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lr_factor(self.tcfg, self.total_steps))
        self.scaler = grad_scaler(self.tcfg.precision, strategy.input_device)
        seed_everything(int(cfg.seed) + ranks.rank)  # per-rank streams from here on (dropout, augmentation)

        self.checkpointer = Checkpointer(cfg, self)
        path, payload = self.checkpointer.find()
        if payload is not None:
            self.checkpointer.restore(payload)  # weights, optimizer, schedule, position, this rank's RNG
            self.resumed_from_step = self.state.global_step
            log.info("resumed from %s: epoch %d, step %d of %d", path, self.state.epoch, self.state.global_step, self.total_steps)
            if self.is_main:
                truncate_metrics(run_dir, self.state.global_step, keep_eval_at_last=self.state.step_in_epoch < self.steps_per_epoch)  # drop lines the lost attempt logged past the checkpoint
        self.attempt = attempts.begin(run_dir, fresh=str(cfg.resume) == "never", resumed_from_step=self.resumed_from_step) if self.is_main else 0

    @property
    def model_name(self) -> str:
        """The model's config choice (model=resnet18), else its _target_."""
        return str(self.cfg.job.get("choices", {}).get("model") or self.cfg.model.get("_target_", "model"))

    @property
    def data_name(self) -> str:
        return str(self.cfg.job.get("choices", {}).get("data") or self.cfg.data.train.get("_target_", "data"))

    # -- one step -------------------------------------------------------------------------
    def _to_input(self, images: torch.Tensor) -> torch.Tensor:
        images = images.to(self.strategy.input_device, non_blocking=True)
        if self.tcfg.channels_last and images.dim() == 4:
            images = images.contiguous(memory_format=torch.channels_last)
        return images

    def train_step(self, images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        self.optimizer.zero_grad(set_to_none=True)
        loss = self.strategy.forward_backward(self.model, self._to_input(images), labels, self.loss_fn, self.scaler)
        if self.scaler is not None:
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            self.optimizer.step()
        self.scheduler.step()
        return loss

    # -- evaluation -----------------------------------------------------------------------
    @torch.no_grad()
    def evaluate(self) -> Dict[str, Optional[float]]:
        """Loss (trainer.loss) and, for class logits against integer labels, accuracy over data.val."""
        self.model.eval()
        totals = torch.zeros(4, dtype=torch.float64)  # correct, samples, summed loss, classified samples
        for images, labels in self.eval_loader:
            totals += self.strategy.eval_counts(self.model, self._to_input(images), labels)
        self.model.train()
        totals = distributed.all_reduce_sum(totals.to(distributed.collective_device(self.strategy.input_device))).cpu()
        count = max(1.0, totals[1].item())
        accuracy = totals[0].item() / count if totals[3].item() == totals[1].item() > 0 else None
        return {"accuracy": accuracy, "loss": totals[2].item() / count, "samples": int(totals[1].item())}

    def _sync(self) -> None:
        if self.strategy.input_device.type == "cuda":
            torch.cuda.synchronize(self.strategy.input_device)

    # -- the loop -------------------------------------------------------------------------
    def _after_step(self) -> None:
        """Checkpoint when due; stop (after a checkpoint) when any rank got a stop signal."""
        state = self.state
        faults.step_sleep()
        if self.checkpointer.due(state.global_step):
            self.checkpointer.save("every %d steps" % self.checkpointer.every)
        if self.stop_watch is None:
            return
        request = self.stop_watch.agreed() if self.ranks.is_distributed else self.stop_watch.request
        if request != NONE:
            self.checkpointer.save("stop signal")
            reason = self.stop_watch.reason(request, float(self.cfg.get("launcher", {}).get("signal_delay_s", 120) or 120))
            raise TrainingInterrupted(request, state.global_step, reason, self.stop_watch)

    def fit(self) -> Dict[str, Any]:
        tcfg, state = self.tcfg, self.state
        if self.resumed_from_step is not None and state.global_step >= self.total_steps and (self.run_dir / "summary.json").exists():
            log.info("this run is already complete (step %d of %d); summary.json is left as it is", state.global_step, self.total_steps)
            import json

            return json.loads((self.run_dir / "summary.json").read_text())
        progress = Progress(self.total_steps, enabled=self.is_main and bool(tcfg.progress), every=int(tcfg.log_every))
        log.info(
            "training %s (%s) on %s, %d steps (%d per epoch), global batch %d = %d ranks x %d",
            self.model_name, self.cfg.strategy.name, self.data_name, self.total_steps, self.steps_per_epoch,
            tcfg.batch_size, self.strategy.data_parallel_size, self.per_rank_batch,
        )
        start_step = state.global_step
        warmup = start_step + min(int(tcfg.throughput_warmup_steps), max(0, self.total_steps - start_step - 1))
        timed_images, timed_seconds, timer_start = 0, 0.0, None
        global_batch = int(tcfg.batch_size)
        self.model.train()
        settle_garbage_collector()
        while state.global_step < self.total_steps:
            sampler = self.train_loader.sampler
            sampler.set_epoch(state.epoch)
            sampler.skip_batches(state.step_in_epoch, self.per_rank_batch)  # mid-epoch resume: the exact next batch
            for images, labels in self.train_loader:
                faults.maybe_fail(self.ranks.rank, state.global_step)
                loss = self.train_step(images, labels)
                state.global_step += 1
                state.step_in_epoch += 1
                if state.global_step == warmup:
                    self._sync()
                    timer_start = time.perf_counter()
                elif state.global_step > warmup:
                    timed_images += global_batch
                    if timer_start is None:
                        timer_start = time.perf_counter()
                final = state.global_step >= self.total_steps
                if state.global_step % int(tcfg.log_every) == 0 or final:
                    state.last_loss = self.strategy.global_loss(loss)
                    self.metrics.write({"kind": "train", "step": state.global_step, "epoch": state.epoch, "loss": state.last_loss, "lr": self.scheduler.get_last_lr()[0], "time": time.time()})
                progress.update(state.global_step, state.last_loss)
                if final:
                    break
                self._after_step()
            epoch_done = state.step_in_epoch >= self.steps_per_epoch
            self._sync()
            if timer_start is not None:
                timed_seconds += time.perf_counter() - timer_start
                timer_start = None
            if tcfg.eval and self.eval_loader is not None and (epoch_done or state.global_step >= self.total_steps):
                state.last_eval = self.evaluate()
                self.metrics.write({"kind": "eval", "step": state.global_step, "epoch": state.epoch, "accuracy": state.last_eval["accuracy"], "loss": state.last_eval["loss"], "time": time.time()})
                accuracy = state.last_eval["accuracy"]
                log.info("epoch %d step %d: eval %seval loss %.4f", state.epoch, state.global_step, "" if accuracy is None else f"accuracy {accuracy:.4f}, ", state.last_eval["loss"])
            if epoch_done:
                state.epoch += 1
                state.step_in_epoch = 0
            if state.global_step > warmup:
                timer_start = time.perf_counter()
        progress.close()
        self.checkpointer.save("end of training")
        last_loss, last_eval = state.last_loss, state.last_eval
        images_per_sec = timed_images / timed_seconds if timed_seconds > 0 else 0.0
        summary = {
            "strategy": self.cfg.strategy.name,
            "model": self.model_name,
            "data": self.data_name,
            "world_size": self.ranks.world_size,
            "data_parallel_size": self.strategy.data_parallel_size,
            "global_batch": global_batch,
            "precision": tcfg.precision,
            "device": str(self.strategy.input_device.type),
            "global_step": state.global_step,
            "epochs_completed": state.epoch,
            "train_loss": last_loss,
            "eval_accuracy": None if last_eval is None else last_eval["accuracy"],
            "eval_loss": None if last_eval is None else last_eval["loss"],
            "images_per_sec": images_per_sec,
            "timed_steps": timed_images // global_batch,
            "resumed_from_step": self.resumed_from_step,
            "attempts": self.attempt,
            "torch_version": torch.__version__,
        }
        plain = self.strategy.unwrap(self.wrapped)
        log.info("final parameter digest %s", parameter_digest(plain))
        weights_name = self.strategy.weights_file()
        if weights_name:
            save_atomic(plain.state_dict(), self.run_dir / weights_name)
        if self.is_main:
            write_json_atomic(self.run_dir / "summary.json", summary)
        return summary
