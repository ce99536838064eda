"""`hybrid`: each task holds one pipelined replica on its S GPUs; DDP averages gradients across tasks and nodes."""

from __future__ import annotations

import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel

from hpc_train.compute.parallel.ddp import ReplicatedAcrossRanks
from hpc_train.compute.parallel.pipeline import PipelineStrategy


class HybridStrategy(ReplicatedAcrossRanks, PipelineStrategy):
    name = "hybrid"

    def wrap(self, model: nn.Module, example=None) -> nn.Module:
        staged = super().wrap(model, example)
        if not self.ranks.is_distributed:
            return staged
        # A module spanning several devices: DDP takes device_ids=None and reduces each stage's gradients in place.
        return DistributedDataParallel(staged, device_ids=None)
