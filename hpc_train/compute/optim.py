"""The optimizer, the LR schedule and the run length, from `trainer.*`."""

from __future__ import annotations

import math
from typing import Callable, Iterable

import torch


def make_optimizer(cfg, params: Iterable[torch.nn.Parameter]) -> torch.optim.Optimizer:
    if cfg.optimizer == "sgd":
        return torch.optim.SGD(params, lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay)
    return torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)


def lr_factor(cfg, total_steps: int) -> Callable[[int], float]:
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


def make_schedule(cfg, optimizer: torch.optim.Optimizer, total_steps: int) -> torch.optim.lr_scheduler.LambdaLR:
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lr_factor(cfg, total_steps))


def total_steps(trainer_cfg, steps_per_epoch: int) -> int:
    """trainer.epochs x steps per epoch, capped by trainer.max_steps (either may be null)."""
    bounds = []
    if trainer_cfg.epochs is not None:
        bounds.append(int(trainer_cfg.epochs) * steps_per_epoch)
    if trainer_cfg.max_steps is not None:
        bounds.append(int(trainer_cfg.max_steps))
    return min(bounds)
