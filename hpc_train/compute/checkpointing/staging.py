"""Staging: a checkpoint's state copied to CPU memory, so that training may go on while the copy is written.

The only part of an asynchronous save that blocks the loop. Everything the state dicts hold by reference (parameters,
optimizer moments, RNG tensors, a schedule's lists) is copied, so the next optimizer step cannot change what is
being written. A GPU tensor is copied into a page-locked (pinned) CPU buffer kept from one save to the next (the
copy runs at full PCIe speed and the buffer is allocated once); a CPU tensor is cloned. A DTensor stays a DTensor
(its local shard copied, its mesh and placements kept), as torch.distributed.checkpoint needs to save it resharded.
"""

from __future__ import annotations

from typing import Any, Dict, Tuple

import torch

Path = Tuple[Any, ...]  # where a tensor sits in the nested state: the keys and indices leading to it


class Stager:
    """Copies nested state to CPU memory; keeps the pinned buffers of GPU tensors between saves."""

    def __init__(self) -> None:
        self.pinned: Dict[Path, torch.Tensor] = {}

    def stage(self, obj: Any) -> Any:
        """A copy of `obj` whose tensors are on the CPU and share no memory with the originals."""
        staged = self._copy(obj, ())
        if self.pinned and torch.cuda.is_available():
            torch.cuda.synchronize()  # the non-blocking copies into pinned buffers are complete
        return staged

    def _copy(self, obj: Any, where: Path) -> Any:
        if isinstance(obj, torch.Tensor):
            return self._tensor(obj.detach(), where)
        if isinstance(obj, dict):
            return type(obj)((key, self._copy(value, (*where, key))) for key, value in obj.items())
        if isinstance(obj, (list, tuple)):
            return type(obj)(self._copy(value, (*where, i)) for i, value in enumerate(obj))
        return obj  # numbers, strings, None: immutable

    def _tensor(self, tensor: torch.Tensor, where: Path) -> torch.Tensor:
        if tensor.device.type == "cpu":
            return tensor.clone()  # a DTensor's clone is a DTensor with its local shard cloned
        if _is_dtensor(tensor):
            return tensor.to("cpu")  # the local shard copied to CPU memory; mesh and placements kept
        buffer = self.pinned.get(where)
        if buffer is None or buffer.shape != tensor.shape or buffer.dtype != tensor.dtype:
            buffer = self.pinned[where] = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)
        buffer.copy_(tensor, non_blocking=True)
        return buffer


def _is_dtensor(tensor: torch.Tensor) -> bool:
    return type(tensor).__name__ == "DTensor"
