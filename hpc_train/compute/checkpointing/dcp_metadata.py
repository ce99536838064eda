"""Reads a DCP checkpoint's ``.metadata`` through a hand-written allow-list, because that file is a pickle
and unpickling an untrusted pickle runs code.

``.metadata`` is DCP's index of every entry of a checkpoint dir, written with ``pickle.dump``;
DCP itself would read it with ``pickle.load``, and torch offers no restricted loader for it
(its ``weights_only`` unpickler reads ``torch.save`` files). ``resume=`` may point into a
directory another user can write, so it is read with :class:`_MetadataUnpickler`, whose
``find_class`` returns only the classes DCP metadata is made of (:data:`ALLOWED_GLOBALS`,
dataclasses and an enum whose construction runs no user-chosen code, plus torch dtypes); any
other global (``posix.system``, a DCP helper function, ...) raises :class:`UnsafeCheckpoint`
before it is called. The list is written by hand because it is the security boundary: a class
joins it only after reading what unpickling it does. The entries it lists may only name plain
files inside the checkpoint dir, with no stream transforms (hpc-train never writes compressed
entries).
"""

from __future__ import annotations

import io
import os
import pickle
import stat
from pathlib import Path
from typing import Any, List

import torch
from torch.distributed.checkpoint.metadata import Metadata

from hpc_train.compute.checkpointing.files import IncompleteCheckpoint, UnsafeCheckpoint, unsafe_checkpoint

METADATA = ".metadata"

# (module, name) of every global a DCP .metadata pickle needs (inspected with pickletools on
# checkpoints of an FSDP2 model + AdamW at 2 ranks and of a plain model, torch 2.14). torch dtypes
# (``torch.float32`` pickles as the global ``torch float32``) are allowed separately.
ALLOWED_GLOBALS = frozenset(
    [
        ("torch.distributed.checkpoint.metadata", name)
        for name in (
            "Metadata",
            "MetadataIndex",
            "StorageMeta",
            "TensorStorageMetadata",
            "TensorProperties",
            "ChunkStorageMetadata",
            "BytesStorageMetadata",
            "_MEM_FORMAT_ENCODING",  # an Enum: TensorProperties pickles its memory format as one
        )
    ]
    + [
        ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),  # file, offset, length of an entry
        ("torch", "Size"),
        ("torch", "device"),
        ("torch.serialization", "_get_layout"),  # how torch.layout pickles: a lookup of torch.strided etc.
        ("pathlib", "PosixPath"),  # StorageMeta.checkpoint_id when saved with a Path
        ("pathlib", "PurePosixPath"),
        ("pathlib._local", "PosixPath"),  # the same class on Python >= 3.13
        ("pathlib._local", "PurePosixPath"),
    ]
)


class _MetadataUnpickler(pickle.Unpickler):
    """``pickle.Unpickler`` that resolves only :data:`ALLOWED_GLOBALS` and torch dtypes."""

    def __init__(self, file: io.BufferedIOBase, path: Path) -> None:
        super().__init__(file)
        self._path = path

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in ALLOWED_GLOBALS:
            return super().find_class(module, name)
        if module == "torch" and isinstance(vars(torch).get(name), torch.dtype):
            return vars(torch)[name]
        raise unsafe_checkpoint(
            self._path, f"its {self._path.name} names the Python global {module}.{name} (loading would call it)"
        )

    def persistent_load(self, pid: Any) -> Any:
        raise unsafe_checkpoint(self._path, f"its {self._path.name} uses pickle persistent ids")


def read_metadata(path: Path) -> Metadata:
    """The DCP metadata in `path` (a checkpoint dir or its .metadata file), unpickled with the allow-list."""
    path = Path(path)
    file = path / METADATA if path.is_dir() else path
    try:
        with open(file, "rb") as handle:
            metadata = _MetadataUnpickler(handle, file).load()
    except UnsafeCheckpoint:
        raise
    except OSError as err:
        raise IncompleteCheckpoint(f"cannot read {file}: {err}") from err
    except Exception as err:  # a torn or garbled pickle: nothing was resolved outside the allow-list
        raise IncompleteCheckpoint(f"{file} is truncated or corrupt ({type(err).__name__}: {err})") from None
    if not isinstance(metadata, Metadata) or not isinstance(metadata.state_dict_metadata, dict):
        raise unsafe_checkpoint(file.parent, f"its {file.name} holds a {type(metadata).__name__}, not DCP metadata")
    _check_storage(file.parent, metadata)
    return metadata


def _check_storage(folder: Path, metadata: Metadata) -> None:
    """Every entry must point into a plain file of the checkpoint dir, untransformed."""
    storage = metadata.storage_data
    if not isinstance(storage, dict):
        raise unsafe_checkpoint(folder, "its .metadata has no table of entries")
    for info in storage.values():
        name = getattr(info, "relative_path", None)
        if not isinstance(name, str) or not bare_name(name):
            raise unsafe_checkpoint(folder, f"its .metadata points outside the checkpoint dir ({name!r})")
        if not _plain_file(folder / name):
            raise IncompleteCheckpoint(f"checkpoint {folder} is incomplete: {name} is missing or not a plain file")
        if getattr(info, "transform_descriptors", None):
            raise unsafe_checkpoint(folder, f"its .metadata asks for stream transforms {info.transform_descriptors!r}")
        offset, length = getattr(info, "offset", None), getattr(info, "length", None)
        if not (isinstance(offset, int) and isinstance(length, int) and offset >= 0 and length >= 0):
            raise unsafe_checkpoint(folder, f"its .metadata has a bad extent for {name} ({offset!r}, {length!r})")


def _plain_file(path: Path) -> bool:
    """A regular file, not a link (which could lead out of the checkpoint dir)."""
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except OSError:
        return False


def bare_name(name: str) -> bool:
    """A file name without a directory part (so it stays inside the checkpoint dir)."""
    return bool(name) and name not in (".", "..") and "/" not in name and "\\" not in name and "\0" not in name


def referenced_files(metadata: Metadata) -> List[str]:
    """The data files the metadata's entries are read from, sorted."""
    return sorted({info.relative_path for info in metadata.storage_data.values()})
