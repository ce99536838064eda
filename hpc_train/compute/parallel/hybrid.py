"""`hybrid`: each task holds one pipelined replica on its S GPUs; DDP averages gradients across tasks and nodes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel

from hpc_train.compute.parallel.ddp import ReplicatedAcrossRanks
from hpc_train.compute.parallel.model_parallel import StagedSettings
from hpc_train.compute.parallel.pipeline import PipelineStrategy


@dataclass(frozen=True)
class HybridSettings(StagedSettings):
    """The stage keys, the micro-batches per step and DDP's find_unused_parameters (no engine: always native)."""

    chunks: Optional[int]  # null: one
    find_unused_parameters: bool


class HybridStrategy(ReplicatedAcrossRanks, PipelineStrategy):
    name = "hybrid"
    settings_type = HybridSettings

    def wrap(self, model: nn.Module, example=None) -> nn.Module:
        staged = super().wrap(model, example)
        if not self.ranks.is_distributed:
            return staged
        # A module spanning several devices: DDP takes device_ids=None and reduces each stage's gradients in place.
        return DistributedDataParallel(staged, device_ids=None)
