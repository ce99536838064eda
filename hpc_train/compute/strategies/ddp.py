"""`ddp`: one process per device, gradients averaged by DistributedDataParallel."""

from __future__ import annotations

import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel

from hpc_train.compute.strategies.base import Strategy


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


class DDPStrategy(ReplicatedAcrossRanks, Strategy):
    name = "ddp"

    def wrap(self, model: nn.Module, example=None) -> nn.Module:
        model = model.to(self.input_device)
        if not self.ranks.is_distributed:
            return model
        device_ids = [self.input_device] if self.input_device.type == "cuda" else None
        return DistributedDataParallel(
            model, device_ids=device_ids, find_unused_parameters=bool(self.cfg.get("find_unused_parameters", False))
        )
