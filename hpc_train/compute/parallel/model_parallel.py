"""`model_parallel`: the model cut into consecutive stages on the task's devices, one stage busy at a time."""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Union

import torch.nn as nn

from hpc_train.compute.parallel.base import Strategy, StrategySettings
from hpc_train.compute.parallel.staged_model import build_staged
from hpc_train.contracts.strategy_table import SplitSettings, split_settings


@dataclass(frozen=True)
class StagedSettings(StrategySettings):
    """The keys of every strategy that cuts the model into stages."""

    stages: Optional[int]
    balance: Union[str, List[int]]
    batchnorm: str
    split_points: Optional[List[str]]


class ModelParallelStrategy(Strategy):
    name = "model_parallel"
    settings_type = StagedSettings

    @property
    def split(self) -> SplitSettings:
        """How the model is cut (hpc_train.contracts.strategy_table reads the stage keys for both sides)."""
        return split_settings(self.settings.node)

    @property
    def needs_example(self) -> bool:
        return self.split.balance == "time"

    @property
    def stages(self) -> int:
        return self.split.stages or len(self.devices)

    @property
    def chunks(self) -> int:
        return self.split.chunks

    def wrap(self, model: nn.Module, example=None) -> nn.Module:
        settings = self.split
        return build_staged(
            model,
            self.devices,
            self.stages,
            settings.balance,
            self.chunks,
            freeze_batchnorm=settings.batchnorm == "freeze",
            example=example,
            split_points=settings.split_points,
        )

    def unwrap(self, model: nn.Module) -> nn.Module:
        return model
