"""Loads a sharded (DCP) checkpoint dir into a run's state without unpickling anything but tensors, plain values
and allow-listed metadata, because ``resume=`` may point at files another user wrote.

Trusted and not trusted: ``resume=`` may point into a directory another user can write, and
a manifest only proves that files are whole, not who wrote them (a forger rewrites it too).
So nothing read from a checkpoint can run code:

* ``.metadata`` is a plain pickle that DCP would load with ``pickle.load``. It is read with
  an allow-list of the classes DCP metadata is made of (hpc_train.compute.checkpointing.dcp_metadata);
  any other global raises :class:`UnsafeCheckpoint` before it is called. The entries it lists
  may only name plain files inside the checkpoint dir, with no stream transforms.
* Tensor entries of the ``.distcp`` files are loaded by DCP itself with
  ``torch.load(weights_only=True)`` (torch 2.14 ``FileSystemReader.read_data``).
* Non-tensor entries (``BYTE_IO``: optimizer hyper-parameters, ...) would be loaded by DCP's
  ``DefaultLoadPlanner.load_bytes`` with ``torch.load(weights_only=False)``: the reader loads
  them with ``weights_only=True`` first and hands the planner only bytes it re-serialised
  from that result (tensors and plain values), never the file's bytes.
* ``loop.pt`` is loaded with ``torch.load(weights_only=True)``; ``manifest.json`` is JSON.

Trusted: torch's own ``weights_only`` unpickler, the allow-listed DCP classes (dataclasses
and an enum whose construction runs no user-chosen code), and the file system under the
checkpoint dir (a checkpoint is not protected against someone swapping files while it loads).
Not checked: *who* wrote a checkpoint; a well-formed forged checkpoint loads forged weights.
"""

from __future__ import annotations

import io
import os
import pickle
import warnings
from pathlib import Path
from typing import Any, Dict, Optional

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.filesystem import FileSystemReader
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta
from torch.distributed.checkpoint.planner import LoadPlan, LoadPlanner, ReadItem

from hpc_train.compute.checkpointing.dcp_failures import describe, own_error
from hpc_train.compute.checkpointing.dcp_manifest import LOOP, Peers, check_file, process_group_peers, verify
from hpc_train.compute.checkpointing.dcp_metadata import read_metadata
from hpc_train.compute.checkpointing.files import (
    CheckpointError,
    UnsafeCheckpoint,
    unsafe_checkpoint,
    unsafe_load_reason,
)


def _weights_only(data: bytes, path: Path, what: str) -> Any:
    """``torch.load(weights_only=True)`` of `data`; refusal (not a traceback) when it holds more."""
    try:
        return torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as err:
        raise unsafe_checkpoint(
            path, f"{what} holds objects other than tensors and plain values ({unsafe_load_reason(err)})"
        ) from None


class _SafeBytesPlanner:
    """Stands in for a LoadPlanner in ``read_data``: non-tensor entries pass a weights_only load first."""

    def __init__(self, planner: LoadPlanner, path: Path) -> None:
        self._planner, self._path = planner, path

    def __getattr__(self, name: str) -> Any:
        return getattr(self._planner, name)

    def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
        what = f"its entry {read_item.dest_index.fqn}"
        clean = io.BytesIO()
        torch.save(_weights_only(value.getvalue(), self._path, what), clean)
        clean.seek(0)
        self._planner.load_bytes(read_item, clean)


class SafeFileSystemReader(FileSystemReader):
    """DCP's FileSystemReader without its two unrestricted unpicklings (see the module docstring).

    ``refused`` keeps the refusal this reader raised: DCP wraps errors of a storage reader
    (or falls back to per-rank metadata), so callers re-raise it as it is.
    """

    def __init__(self, path: str | os.PathLike) -> None:
        super().__init__(path)
        self.refused: Optional[UnsafeCheckpoint] = None

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        file = Path(self._get_metadata_path(kwargs.get("rank")))
        try:
            metadata = read_metadata(file)
        except UnsafeCheckpoint as err:
            self.refused = err
            raise
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Any:
        try:
            return super().read_data(plan, _SafeBytesPlanner(planner, Path(self.path)))  # type: ignore[arg-type]
        except UnsafeCheckpoint as err:
            self.refused = err
            raise
        except pickle.UnpicklingError as err:  # a tensor entry that is not a tensor
            self.refused = unsafe_checkpoint(
                Path(self.path), f"a tensor entry holds other objects ({unsafe_load_reason(err)})"
            )
            raise self.refused from None


def load_into(state: Dict[str, Any], path: Path, no_dist: bool) -> None:
    """``dcp.load`` through the safe reader, its errors turned into one CheckpointError."""
    reader = SafeFileSystemReader(path)
    try:
        with warnings.catch_warnings():
            if no_dist:  # DCP warns "assuming the intent is to load in a single process" even when told so
                warnings.filterwarnings("ignore", message="torch.distributed is disabled")
            dcp.load(state, checkpoint_id=str(path), storage_reader=reader, no_dist=no_dist)
    except (Exception, CheckpointException) as err:
        refused = reader.refused or own_error(err)  # another rank's refusal arrives inside DCP's exception
        if refused is not None:
            raise refused from None
        raise CheckpointError(f"cannot load checkpoint {path}: {describe(err)}") from (
            err if isinstance(err, Exception) else None
        )


def load_dcp(state: Dict[str, Any], path: Path, deep: bool = True, peers: Optional[Peers] = None) -> None:
    """Verify the checkpoint dir `path`, then load it into `state` in place (a collective).

    `state` is what :func:`hpc_train.compute.checkpointing.dcp_save.save_dcp` was given, freshly
    built (any sharding, any world size: DCP reshards). `deep` also checks the sha256 of every
    file, each rank hashing a share (`peers`: by default the default process group's ranks);
    `deep=False` keeps only the size checks (no rank reads the checkpoint for them); safety does
    not depend on it.
    """
    path = Path(path)
    verify(path, deep=deep, peers=(peers or process_group_peers()) if deep else None)
    if not deep:
        read_metadata(path)  # a forged .metadata is refused here, with its own message (deep verify did it)
    load_into(state, path, no_dist=False)


def read_loop(path: Path) -> Dict[str, Any]:
    """``loop.pt`` of a checkpoint dir (checked against the manifest), loaded with weights_only=True."""
    path = Path(path)
    manifest = verify(path)
    check_file(path, LOOP, manifest["files"][LOOP], deep=True)
    loop = _weights_only((path / LOOP).read_bytes(), path, f"its {LOOP}")
    if not isinstance(loop, dict):
        raise unsafe_checkpoint(path, f"its {LOOP} holds a {type(loop).__name__}, not a dict")
    return loop
