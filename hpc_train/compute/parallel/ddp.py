"""`ddp`: one process per device, gradients averaged by DistributedDataParallel."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, ContextManager

import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel

from hpc_train.compute.parallel.base import Strategy, StrategySettings


@dataclass(frozen=True)
class DDPSettings(StrategySettings):
    find_unused_parameters: bool


class ReplicatedAcrossRanks:
    """Every rank holds a full replica (wrapped in DDP) and reads its own shard of the data."""

    def unwrap(self, model: nn.Module) -> nn.Module:
        return model.module if isinstance(model, DistributedDataParallel) else model

    @property
    def data_parallel_size(self) -> int:
        return self.ranks.world_size

    @property
    def data_parallel_rank(self) -> int:
        return self.ranks.rank

    def no_sync(self, model: nn.Module) -> ContextManager:
        """DDP's own no_sync: gradients accumulate locally, the all-reduce waits for the last micro-batch."""
        model = getattr(model, "_orig_mod", model)  # under torch.compile
        return model.no_sync() if isinstance(model, DistributedDataParallel) else contextlib.nullcontext()

    def settle(self, model: nn.Module, batch: Any) -> None:
        """Let DDP lay out its gradient buckets before the first real step of every attempt.

        DDP re-orders its buckets after the first backward of a process (in the order the
        gradients became ready). A resumed attempt would take its first step on the first layout
        where an uninterrupted run took that step on the re-ordered one; with more than two
        ranks the all-reduce then adds in another order and the resumed run drifts from the
        uninterrupted one in the last bits. One forward and backward of this batch in eval mode
        (no dropout draw, no batch-norm statistics update), its gradients dropped, makes every
        attempt's steps run on the re-ordered buckets. Two ranks add a + b either way: skipped.
        """
        if (
            not isinstance(model, DistributedDataParallel)
            or self.ranks.world_size <= 2
            or model.find_unused_parameters  # DDP does not re-order then
        ):
            return
        training = model.training
        model.eval()
        try:
            self.forward_backward(model, batch, None)
        finally:
            model.train(training)
            model.zero_grad(set_to_none=True)


class DDPStrategy(ReplicatedAcrossRanks, Strategy):
    name = "ddp"
    settings_type = DDPSettings
    settings: DDPSettings

    def wrap(self, model: nn.Module, example=None) -> nn.Module:
        model = model.to(self.input_device)
        if not self.ranks.is_distributed:
            return model
        device_ids = [self.input_device] if self.input_device.type == "cuda" else None
        return DistributedDataParallel(
            model, device_ids=device_ids, find_unused_parameters=bool(self.settings.find_unused_parameters)
        )
