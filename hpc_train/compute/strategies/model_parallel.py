"""`model_parallel`: the model cut into consecutive stages on the task's devices, one stage busy at a time."""

from __future__ import annotations

import torch.nn as nn

from hpc_train.compute.stages import build_staged
from hpc_train.compute.strategies.base import Strategy


class ModelParallelStrategy(Strategy):
    name = "model_parallel"
    default_chunks = 1

    @property
    def needs_example(self) -> bool:
        return self.cfg.get("balance", "params") == "time"

    @property
    def split_points(self) -> list:
        return [str(name) for name in self.cfg.get("split_points") or []]

    @property
    def stages(self) -> int:
        if self.split_points:
            return len(self.split_points) + 1
        return int(self.cfg.get("stages") or len(self.devices))

    @property
    def chunks(self) -> int:
        return int(self.cfg.get("chunks") or self.default_chunks)

    def wrap(self, model: nn.Module, example=None) -> nn.Module:
        balance = self.cfg.get("balance", "params")
        balance = balance if isinstance(balance, str) else list(balance)
        return build_staged(
            model, self.devices, self.stages, balance, self.chunks,
            freeze_batchnorm=self.cfg.get("batchnorm", "keep") == "freeze", example=example, split_points=self.split_points,
        )

    def unwrap(self, model: nn.Module) -> nn.Module:
        return model
