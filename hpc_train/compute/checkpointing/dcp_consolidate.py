"""The full (unsharded) model weights of a sharded checkpoint dir on one process without a process group, for
``hpc-train-export``: only DCP can read the shard files, and it reshards them into whole tensors.
"""

from __future__ import annotations

from pathlib import Path
from typing import Dict

import torch
from torch.distributed.checkpoint.metadata import Metadata, TensorStorageMetadata

from hpc_train.compute.checkpointing.dcp_load import load_into
from hpc_train.compute.checkpointing.dcp_manifest import verify
from hpc_train.compute.checkpointing.dcp_metadata import read_metadata, referenced_files
from hpc_train.compute.checkpointing.files import CheckpointError, unsafe_checkpoint


def model_entries(metadata: Metadata, prefix: str = "model.") -> Dict[str, TensorStorageMetadata]:
    """The tensor entries under `prefix` (``get_state_dict``'s model state saved as ``{"model": msd}``)."""
    return {
        key: entry
        for key, entry in metadata.state_dict_metadata.items()
        if key.startswith(prefix) and isinstance(entry, TensorStorageMetadata)
    }


def consolidate(path: Path, prefix: str = "model.") -> Dict[str, torch.Tensor]:
    """The full (unsharded) model weights of a checkpoint dir, on one process without a process group.

    Keys drop the ``model.`` prefix: the result loads into the unwrapped model with
    ``load_state_dict``. Optimizer entries are not read. ``prefix="ema."``: the weight average
    of ``trainer.ema_decay`` instead (its parameters; the model's buffers are not averaged).
    """
    path = Path(path)
    verify(path, deep=True)
    metadata = read_metadata(path)
    entries = model_entries(metadata, prefix)
    if not entries:
        if prefix == "ema.":
            raise CheckpointError(f"checkpoint {path} holds no weight average: the run had trainer.ema_decay=null")
        raise CheckpointError(
            f"checkpoint {path} has no model.* tensors: not a checkpoint of hpc-train's fsdp strategy"
        )
    _check_sizes(path, metadata, entries)
    state = {key: torch.empty(tuple(e.size), dtype=e.properties.dtype) for key, e in entries.items()}
    load_into(state, path, no_dist=True)
    return {key[len(prefix) :]: tensor for key, tensor in state.items()}


def _check_sizes(path: Path, metadata: Metadata, entries: Dict[str, TensorStorageMetadata]) -> None:
    """Shapes and dtypes must be real, and no larger than the data files hold (no memory bomb)."""
    total = 0
    for key, entry in entries.items():
        dtype, size = getattr(entry.properties, "dtype", None), getattr(entry, "size", None)
        real = isinstance(size, tuple) and all(isinstance(n, int) and n >= 0 for n in size)
        if not isinstance(dtype, torch.dtype) or not real:
            raise unsafe_checkpoint(path, f"its .metadata describes {key} with dtype {dtype!r} and size {size!r}")
        total += torch.Size(size).numel() * dtype.itemsize
    stored = sum((path / name).stat().st_size for name in referenced_files(metadata))
    if total > stored:
        raise unsafe_checkpoint(
            path, f"its .metadata describes {total} bytes of weights in {stored} bytes of data files"
        )
