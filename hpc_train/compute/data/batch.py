"""Batches of any structure: tensors, tuples/lists, mappings (dicts, Hugging Face ``BatchEncoding``) and nestings.

The trainer never looks inside a batch except to move its tensor leaves to the input device
and to know its size; what the leaves mean is the training step's business
(hpc_train.compute.user.step). The size of a batch is the first dimension of its first tensor leaf.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Callable, Iterator, List, Optional

import torch


def map_tensors(batch: Any, fn: Callable[[torch.Tensor], torch.Tensor]) -> Any:
    """`batch` with `fn` applied to every tensor leaf, containers rebuilt with their own type where they allow it."""
    if isinstance(batch, torch.Tensor):
        return fn(batch)
    if isinstance(batch, Mapping):
        items = {key: map_tensors(value, fn) for key, value in batch.items()}
        try:
            return type(batch)(items)  # dict, OrderedDict, BatchEncoding keep their type
        except Exception:
            return items
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):  # a namedtuple
        return type(batch)(*(map_tensors(value, fn) for value in batch))
    if isinstance(batch, (tuple, list)):
        return type(batch)(map_tensors(value, fn) for value in batch)
    return batch


def tensors(batch: Any) -> Iterator[torch.Tensor]:
    """Every tensor leaf, in order (mappings in their key order)."""
    if isinstance(batch, torch.Tensor):
        yield batch
    elif isinstance(batch, Mapping):
        for value in batch.values():
            yield from tensors(value)
    elif isinstance(batch, (tuple, list)):
        for value in batch:
            yield from tensors(value)


def first_tensor(batch: Any) -> Optional[torch.Tensor]:
    return next(tensors(batch), None)


def batch_size(batch: Any) -> int:
    """The first dimension of the first tensor leaf (1 for a batch without one)."""
    first = first_tensor(batch)
    return int(first.shape[0]) if first is not None and first.dim() > 0 else 1


def split_batch(batch: Any, pieces: int) -> List[Any]:
    """`batch` cut along its first dimension into `pieces` batches of the same structure (sizes differ by at most
    one, as ``torch.tensor_split`` cuts); leaves that are not tensors of the batch's size are repeated in each."""
    size = batch_size(batch)
    pieces = max(1, min(pieces, size))

    def piece(index: int) -> Any:
        return map_tensors(
            batch,
            lambda t: torch.tensor_split(t, pieces)[index] if t.dim() > 0 and t.shape[0] == size else t,
        )

    return [piece(index) for index in range(pieces)]


def to_device(batch: Any, device: torch.device, channels_last: bool = False) -> Any:
    """Every tensor leaf on `device` (non-blocking: pinned leaves copy asynchronously); with `channels_last`,
    every 4-D floating-point leaf (an image batch) in channels-last memory format."""

    def move(tensor: torch.Tensor) -> torch.Tensor:
        tensor = tensor.to(device, non_blocking=True)
        if channels_last and tensor.dim() == 4 and tensor.is_floating_point():
            tensor = tensor.contiguous(memory_format=torch.channels_last)
        return tensor

    return map_tensors(batch, move)


def describe(value: Any) -> str:
    """A short description for messages: 'shape (2, 8)', 'a dict with keys input_ids, labels', 'a tuple of 3'."""
    if isinstance(value, torch.Tensor):
        return f"a tensor of shape {tuple(value.shape)}"
    if isinstance(value, Mapping):
        return f"a {type(value).__name__} with keys {', '.join(map(str, value.keys()))}"
    if isinstance(value, (tuple, list)):
        return f"a {type(value).__name__} of {len(value)}"
    if value is None:
        return "None"
    return f"a {type(value).__name__}"
