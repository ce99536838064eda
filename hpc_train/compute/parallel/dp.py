"""`dp`: one process drives all its GPUs with nn.DataParallel (batch split, outputs gathered on the first GPU)."""

from __future__ import annotations

import logging
from typing import Any

import torch
import torch.nn as nn

from hpc_train.compute.parallel.base import Strategy

log = logging.getLogger("hpc_train")


class DataParallelStrategy(Strategy):
    name = "dp"
    _gpus: list = []

    def wrap(self, model: nn.Module, example=None) -> nn.Module:
        model = model.to(self.input_device)
        gpus = self._gpus = sorted({d.index for d in self.devices if d.type == "cuda"})
        if len(gpus) < 2:
            log.warning(
                "strategy=dp needs at least 2 GPUs, found %d: running as `single` on %s", len(gpus), self.input_device
            )
            return model
        return nn.DataParallel(model, device_ids=gpus, output_device=gpus[0])

    def unwrap(self, model: nn.Module) -> nn.Module:
        return model.module if isinstance(model, nn.DataParallel) else model

    def reduce_replicas(self, value: Any) -> Any:
        """A loss or metric computed inside the model (a user step's model(**batch).loss) comes back once per GPU,
        gathered into a vector: their mean is the batch's value (the GPUs hold equal shares)."""
        if isinstance(value, torch.Tensor) and value.dim() == 1 and value.numel() == len(self._gpus) > 1:
            return value.mean()
        return value
