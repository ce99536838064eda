"""`hybrid`: each task holds one pipelined replica on its S GPUs; DDP averages gradients across tasks and nodes."""

from __future__ import annotations

import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel

from hpc_train.compute.strategies.pipeline import PipelineStrategy


class HybridStrategy(PipelineStrategy):
    name = "hybrid"

    def wrap(self, model: nn.Module, example=None) -> nn.Module:
        staged = super().wrap(model, example)
        if not self.ranks.is_distributed:
            return staged
        # A module spanning several devices: DDP takes device_ids=None and reduces each stage's gradients in place.
        return DistributedDataParallel(staged, device_ids=None)

    def unwrap(self, model: nn.Module) -> nn.Module:
        return model.module if isinstance(model, DistributedDataParallel) else model

    @property
    def data_parallel_size(self) -> int:
        return self.ranks.world_size

    @property
    def data_parallel_rank(self) -> int:
        return self.ranks.rank
