"""`model_parallel`: the model cut into consecutive stages on the task's devices, one stage busy at a time."""

from __future__ import annotations

import torch.nn as nn

from hpc_train.compute.parallel.staged_model import build_staged
from hpc_train.compute.parallel.base import Strategy
from hpc_train.strategy_table import SplitSettings, split_settings


class ModelParallelStrategy(Strategy):
    name = "model_parallel"

    @property
    def settings(self) -> SplitSettings:
        return split_settings(self.cfg)

    @property
    def needs_example(self) -> bool:
        return self.settings.balance == "time"

    @property
    def stages(self) -> int:
        return self.settings.stages or len(self.devices)

    @property
    def chunks(self) -> int:
        return self.settings.chunks

    def wrap(self, model: nn.Module, example=None) -> nn.Module:
        settings = self.settings
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
