"""Sharded checkpoints (``torch.distributed.checkpoint``, DCP): atomic saves, safe loads, export.

``strategy=fsdp`` saves one *directory* per checkpoint instead of one file, every rank writing
its own shards. Layout (``<run dir>/checkpoints/``)::

    step_000000010/            a complete checkpoint (appears only by an atomic rename)
      .metadata                DCP's index of every entry: pickle, read with an allow-list
      __<r>_0.distcp           rank r's shards: torch.save'd tensors and small plain values
      loop.pt                  rank 0: loop state, RNG states per rank, fingerprint (weights_only)
      manifest.json            written last: size and sha256 of every other file of the dir
    .step_000000011.dcp.tmp/   a save in progress, or one a kill interrupted (removed on restart)

Trusted and not trusted: ``resume=`` may point into a directory another user can write, and
a manifest only proves that files are whole, not who wrote them (a forger rewrites it too).
So nothing read from a checkpoint can run code:

* ``.metadata`` is a plain pickle that DCP would load with ``pickle.load``. It is read with
  :class:`_MetadataUnpickler`, whose ``find_class`` returns only the classes DCP metadata is
  made of (:data:`ALLOWED_GLOBALS`, plus torch dtypes); any other global (``posix.system``,
  a DCP helper function, ...) raises :class:`UnsafeCheckpoint` before it is called. The
  entries it lists may only name plain files inside the checkpoint dir, with no stream
  transforms (hpc-train never writes compressed entries).
* Tensor entries of the ``.distcp`` files are loaded by DCP itself with
  ``torch.load(weights_only=True)`` (torch 2.14 ``FileSystemReader.read_data``).
* Non-tensor entries (``BYTE_IO``: optimizer hyper-parameters, ...) would be loaded by DCP's
  ``DefaultLoadPlanner.load_bytes`` with ``torch.load(weights_only=False)``: the reader loads
  them with ``weights_only=True`` first and hands the planner only bytes it re-serialised
  from that result (tensors and plain values), never the file's bytes.
* ``loop.pt`` is loaded with ``torch.load(weights_only=True)``; ``manifest.json`` is JSON.

Hashing is spread over the ranks: at a save each rank hashes only the files it wrote (DCP's
``write_data`` names them) and rank 0 gathers those small entries for the manifest; a deep
verification at load hashes each file on one rank and the ranks agree on the first failure.
So no rank reads the whole checkpoint back (~84 GB for a 7B model with AdamW).

Trusted: torch's own ``weights_only`` unpickler, the allow-listed DCP classes (dataclasses
and an enum whose construction runs no user-chosen code), and the file system under the
checkpoint dir (a checkpoint is not protected against someone swapping files while it loads).
Not checked: *who* wrote a checkpoint; a well-formed forged checkpoint loads forged weights.
"""

from __future__ import annotations

import ctypes
import errno
import hashlib
import io
import json
import logging
import os
import pickle
import re
import stat
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, List, Optional, Tuple

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.filesystem import FileSystemReader, FileSystemWriter
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta, TensorStorageMetadata
from torch.distributed.checkpoint.planner import LoadPlan, LoadPlanner, ReadItem

from hpc_train import rundir
from hpc_train.compute.runtime import faults
from hpc_train.compute.checkpointing.files import (
    CheckpointError,
    CheckpointRefused,
    DISK_FULL_ERRNOS,
    DiskFull,  # noqa: F401 (re-exported: callers of dcp_io catch it from here)
    disk_full_error,
)

log = logging.getLogger("hpc_train")

METADATA = ".metadata"
LOOP = "loop.pt"
MANIFEST = rundir.SHARDED_MANIFEST
MANIFEST_FORMAT = 1
# Temporaries of both formats: ".step_000000010.dcp.tmp" (this module, also "-replaced"/"-pruned")
# and ".step_000000010.ckpt.tmp<pid>" (rundir.write_bytes_atomic for today's single-file checkpoints).

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


# -- errors ---------------------------------------------------------------------------------
class UnsafeCheckpoint(CheckpointRefused):
    """A checkpoint that would run code if loaded the ordinary way; nothing in it was run.

    A :class:`CheckpointRefused` (so a :class:`Refusal`): never skipped in favour of an older
    checkpoint, the user decides.
    """


class IncompleteCheckpoint(CheckpointError):
    """A checkpoint dir that is missing files, truncated or corrupt (a kill, a full disk, bit rot).

    Like a torn checkpoint file, it may be skipped in favour of the previous complete one.
    """


def _refused(path: Path, what: str) -> UnsafeCheckpoint:
    return UnsafeCheckpoint(
        f"refusing to load checkpoint {path}: {what}, which hpc-train never writes; it may have been tampered"
        " with. Nothing in it was run. Fix: resume from a checkpoint you trust, or start over with resume=never"
        " or a new hydra.run.dir."
    )


# -- safe reading -----------------------------------------------------------------------------
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
        raise _refused(
            self._path, f"its {self._path.name} names the Python global {module}.{name} (loading would call it)"
        )

    def persistent_load(self, pid: Any) -> Any:
        raise _refused(self._path, f"its {self._path.name} uses pickle persistent ids")


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
        raise _refused(file.parent, f"its {file.name} holds a {type(metadata).__name__}, not DCP metadata")
    _check_storage(file.parent, metadata)
    return metadata


def _check_storage(folder: Path, metadata: Metadata) -> None:
    """Every entry must point into a plain file of the checkpoint dir, untransformed."""
    storage = metadata.storage_data
    if not isinstance(storage, dict):
        raise _refused(folder, "its .metadata has no table of entries")
    for info in storage.values():
        name = getattr(info, "relative_path", None)
        if not isinstance(name, str) or not _bare_name(name):
            raise _refused(folder, f"its .metadata points outside the checkpoint dir ({name!r})")
        if not _plain_file(folder / name):
            raise IncompleteCheckpoint(f"checkpoint {folder} is incomplete: {name} is missing or not a plain file")
        if getattr(info, "transform_descriptors", None):
            raise _refused(folder, f"its .metadata asks for stream transforms {info.transform_descriptors!r}")
        offset, length = getattr(info, "offset", None), getattr(info, "length", None)
        if not (isinstance(offset, int) and isinstance(length, int) and offset >= 0 and length >= 0):
            raise _refused(folder, f"its .metadata has a bad extent for {name} ({offset!r}, {length!r})")


def _plain_file(path: Path) -> bool:
    """A regular file, not a link (which could lead out of the checkpoint dir)."""
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except OSError:
        return False


def _bare_name(name: str) -> bool:
    return bool(name) and name not in (".", "..") and "/" not in name and "\\" not in name and "\0" not in name


def _referenced_files(metadata: Metadata) -> List[str]:
    return sorted({info.relative_path for info in metadata.storage_data.values()})


def _weights_only(data: bytes, path: Path, what: str) -> Any:
    """``torch.load(weights_only=True)`` of `data`; refusal (not a traceback) when it holds more."""
    try:
        return torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as err:
        raise _refused(path, f"{what} holds objects other than tensors and plain values ({_reason(err)})") from None


def _reason(err: Exception) -> str:
    """The telling line of torch's long weights_only error, e.g. ``... unsupported GLOBAL posix.system ...``."""
    text = str(err)
    match = re.search(r"WeightsUnpickler error: (.*?)(?: was not an allowed global| Please|$)", text, flags=re.M)
    if match:
        return match.group(1)[:200]
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    telling = [line for line in lines if "GLOBAL" in line] or lines or [type(err).__name__]
    return telling[0][:200]


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
            self.refused = _refused(Path(self.path), f"a tensor entry holds other objects ({_reason(err)})")
            raise self.refused from None


# -- verification ---------------------------------------------------------------------------
def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def read_manifest(path: Path) -> Dict[str, Any]:
    """``manifest.json`` of a checkpoint dir, checked for shape (names, sizes, digests)."""
    file = Path(path) / MANIFEST
    try:
        manifest = json.loads(file.read_text())
    except OSError as err:
        raise IncompleteCheckpoint(f"{path} is not a complete checkpoint: no readable {MANIFEST} ({err})") from None
    except ValueError:
        raise IncompleteCheckpoint(f"{path} is not a complete checkpoint: {MANIFEST} is torn or corrupt") from None
    files = manifest.get("files") if isinstance(manifest, dict) else None
    if not isinstance(files, dict) or manifest.get("format") != MANIFEST_FORMAT:
        raise IncompleteCheckpoint(f"{path} is not a checkpoint of this hpc-train ({MANIFEST} of another format)")
    for name, entry in files.items():
        ok = isinstance(entry, dict) and isinstance(entry.get("size"), int) and isinstance(entry.get("sha256"), str)
        if not (ok and _bare_name(name) and name != MANIFEST):
            raise IncompleteCheckpoint(f"{path} is not a complete checkpoint: bad {MANIFEST} entry {name!r}")
    return manifest


def _check_file(folder: Path, name: str, entry: Dict[str, Any], deep: bool) -> None:
    file = folder / name
    try:
        info = os.lstat(file)
    except OSError:
        raise IncompleteCheckpoint(f"checkpoint {folder} is incomplete: {name} is missing") from None
    if not stat.S_ISREG(info.st_mode):
        raise IncompleteCheckpoint(f"checkpoint {folder} is not usable: {name} is not a plain file")
    if info.st_size != entry["size"]:
        raise IncompleteCheckpoint(
            f"checkpoint {folder} is truncated or corrupt: {name} has {info.st_size} bytes, its manifest says"
            f" {entry['size']}"
        )
    if deep and _sha256(file) != entry["sha256"]:
        raise IncompleteCheckpoint(
            f"checkpoint {folder} is corrupt or was modified: the sha256 of {name} does not match its manifest"
        )


@dataclass(frozen=True)
class Peers:
    """The ranks that verify a checkpoint together: each hashes a share of its files, all learn of any failure.

    `all_gather(obj)` returns every rank's picklable `obj` in rank order, on every rank.
    """

    rank: int
    world: int
    all_gather: Callable[[Any], List[Any]]


def _process_group_peers() -> Optional[Peers]:
    """The default process group's ranks (the group ``dcp.load`` uses); None for a single process."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return None
    world = dist.get_world_size()

    def all_gather(obj: Any) -> List[Any]:
        found: List[Any] = [None] * world
        dist.all_gather_object(found, obj)
        return found

    return Peers(dist.get_rank(), world, all_gather)


def _hashing_ranks(files: Dict[str, Any], world: int) -> Dict[str, int]:
    """Which rank hashes which file: biggest first, each to the rank with the fewest bytes so far.

    Computed from the manifest alone, so every rank gets the same answer without talking.
    """
    load = [0] * world
    owner: Dict[str, int] = {}
    for name in sorted(files, key=lambda n: (-files[n]["size"], n)):
        rank = min(range(world), key=lambda r: (load[r], r))
        owner[name] = rank
        load[rank] += files[name]["size"]
    return owner


def _read_complete_manifest(folder: Path) -> Dict[str, Any]:
    if not folder.is_dir():
        raise IncompleteCheckpoint(f"{folder} is not a checkpoint dir")
    manifest = read_manifest(folder)
    for required in (METADATA, LOOP):
        if required not in manifest["files"]:
            raise IncompleteCheckpoint(f"{folder} is not a complete checkpoint: its manifest lacks {required}")
    return manifest


def _check_covered(folder: Path, files: Dict[str, Any]) -> None:
    """The .metadata (read with the allow-list) may only read files the manifest covers."""
    missing = [name for name in _referenced_files(read_metadata(folder)) if name not in files]
    if missing:
        raise _refused(folder, f"its .metadata reads files its manifest does not cover ({', '.join(missing)})")


# (position in the order of the checks, the error): the earliest position is the error a single process raises
_Failure = Tuple[int, Exception]


def _first_failure(folder: Path, deep: bool, peers: Optional[Peers]) -> Tuple[Optional[Dict[str, Any]], Optional[_Failure]]:
    """Every check in a fixed order, hashing only this rank's share; the manifest, or the first failure."""
    try:
        manifest = _read_complete_manifest(folder)
    except Exception as err:
        return None, (0, err)
    files = manifest["files"]
    owner = _hashing_ranks(files, peers.world) if peers is not None else None
    for position, (name, entry) in enumerate(files.items(), start=1):
        mine = owner is None or owner[name] == peers.rank  # type: ignore[union-attr]
        try:
            _check_file(folder, name, entry, deep and mine)
        except Exception as err:
            return None, (position, err)
    if deep:
        try:
            _check_covered(folder, files)
        except Exception as err:
            return None, (len(files) + 1, err)
    return manifest, None


def _earliest(failures: Iterable[Optional[_Failure]]) -> Optional[_Failure]:
    found = [failure for failure in failures if failure is not None]
    return min(found, key=lambda failure: failure[0]) if found else None


def verify(path: Path, deep: bool = False, peers: Optional[Peers] = None) -> Dict[str, Any]:
    """Check a checkpoint dir against its manifest; returns the manifest or raises a CheckpointError.

    Shallow: the files exist with their sizes. `deep`: also their sha256, and the .metadata
    (read with the allow-list, so a forged one raises :class:`UnsafeCheckpoint`) names only
    files the manifest covers. Nothing is ever unpickled beyond that. With `peers` (a
    collective) each rank hashes only its share and every rank raises the same error: the
    one a single process checking everything would raise.
    """
    spread = deep and peers is not None and peers.world > 1
    manifest, failure = _first_failure(Path(path), deep, peers if spread else None)
    if spread:
        failure = _earliest(peers.all_gather(failure))  # type: ignore[union-attr]
    if failure is not None:
        raise failure[1]
    return manifest  # type: ignore[return-value]


def is_complete(path: Path) -> bool:
    """True when `path` is a checkpoint dir whose files match its manifest's sizes (cheap: no hashing)."""
    try:
        verify(path)
    except CheckpointError:
        return False
    return True


# -- listing and clean-up --------------------------------------------------------------------
def step_dir(folder: Path, step: int) -> Path:
    return Path(folder) / rundir.step_name(step)


def _temporary(folder: Path, step: int, why: str = "") -> Path:
    """Same name on every rank (derived from the step), so all ranks write into one dir."""
    return Path(folder) / f".{rundir.step_name(step)}.dcp.tmp{why}"


def list_dcp_checkpoints(folder: Path) -> List[Path]:
    """Checkpoint dirs (``step_<9 digits>``) in `folder`, newest first; unverified."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    found = [(step, p) for p in folder.iterdir() if p.is_dir() and (step := rundir.checkpoint_step(p)) is not None]
    return [p for _, p in sorted(found, reverse=True)]


def newest_complete(folder: Path) -> Optional[Path]:
    """The newest checkpoint dir of `folder` that is complete; incomplete newer ones are skipped with a warning."""
    for path in list_dcp_checkpoints(folder):
        try:
            verify(path)
            return path
        except CheckpointError as err:
            log.warning("skipping checkpoint: %s; falling back to the previous one", err)
    return None


_remove = rundir.remove_path


def checkpoint_bytes(path: Path) -> int:
    """Bytes of every file under `path` (a checkpoint dir); 0 when it does not exist."""
    total = 0
    for root, _, names in os.walk(path):
        for name in names:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except OSError:
                pass
    return total


def tensor_bytes(obj: Any) -> int:
    """Bytes of the tensors in nested containers (a DTensor counts its global size)."""
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, dict):
        return sum(tensor_bytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(tensor_bytes(v) for v in obj)
    return 0


# -- saving ------------------------------------------------------------------------------------
class _Writer(FileSystemWriter):
    """FileSystemWriter that remembers which files this rank wrote (so it hashes those alone) and a
    full disk on this rank: DCP hands other ranks only a pickled copy of the error (and torch.save
    turns ENOSPC into a RuntimeError whose context is the OSError), so this is the only place the
    errno is still known."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.disk_full = False
        self.written: List[str] = []  # names relative to the checkpoint dir, from DCP's WriteResults

    def write_data(self, plan: Any, planner: Any) -> Any:
        try:
            future = super().write_data(plan, planner)
            future.wait()
            self.written = sorted({result.storage_data.relative_path for result in future.value()})
            return future
        except BaseException as err:
            self.disk_full = self.disk_full or _is_disk_full(err)
            raise

    def finish(self, metadata: Metadata, results: Any) -> None:
        try:
            super().finish(metadata, results)
        except BaseException as err:
            self.disk_full = self.disk_full or _is_disk_full(err)
            raise


def _is_disk_full(err: Optional[BaseException]) -> bool:
    """ENOSPC or EDQUOT anywhere in `err`'s chain or among the failures DCP collected."""
    seen = set()
    todo = [err]
    while todo:
        exc = todo.pop()
        if exc is None or id(exc) in seen:
            continue
        seen.add(id(exc))
        if isinstance(exc, OSError) and exc.errno in DISK_FULL_ERRNOS:
            return True
        todo += [exc.__cause__, exc.__context__]
        if isinstance(exc, CheckpointException):
            todo += [failure[0] for failure in exc.failures.values()]
    return False


Entries = Dict[str, Dict[str, Any]]  # file name -> {"size": bytes, "sha256": hex digest}, as in the manifest


def _file_entries(folder: Path, names: Iterable[str]) -> Entries:
    """Size and sha256 of the files `names` of `folder` (the files this rank wrote)."""
    entries = {}
    for name in sorted(names):
        file = Path(folder) / name
        entries[name] = {"size": file.stat().st_size, "sha256": _sha256(file)}
    return entries


def _merged(parts: Optional[List[Optional[Entries]]]) -> Optional[Entries]:
    """Every rank's entries in one table; None when a rank has none (it failed, and says so)."""
    if parts is None or any(part is None for part in parts):
        return None
    return {name: entry for part in parts for name, entry in part.items()}  # type: ignore[union-attr]


def _write_manifest(folder: Path, step: int, extra: Dict[str, Any], hashed: Optional[Entries] = None) -> None:
    """``manifest.json``: every file of the dir with its size and sha256; the last file written.

    `hashed`: the entries the ranks made of their own files; the files left (.metadata, loop.pt:
    rank 0's alone) are hashed here. Without it (one process wrote everything) all are.
    """
    done = dict(hashed or {})
    left = [f.name for f in Path(folder).iterdir() if f.name != MANIFEST and f.name not in done and f.is_file()]
    done.update(_file_entries(folder, left))
    files = {name: done[name] for name in sorted(done)}
    manifest: Dict[str, Any] = {"format": MANIFEST_FORMAT, "step": step, "files": files}
    try:  # the config fingerprint, readable on the login node without torch (as in today's files)
        manifest["fingerprint"] = json.loads(json.dumps(extra.get("fingerprint")))
    except (TypeError, ValueError):
        pass
    rundir.write_durable(Path(folder) / MANIFEST, json.dumps(manifest, indent=1).encode())


def _write_rank0_files(tmp: Path, step: int, extra: Dict[str, Any], hashed: Optional[Entries] = None) -> None:
    """loop.pt, then the manifest (`hashed`: the shard entries the ranks gathered), then the dir synced."""
    buffer = io.BytesIO()
    torch.save(extra, buffer)
    rundir.write_durable(tmp / LOOP, buffer.getvalue())
    _write_manifest(tmp, step, extra, hashed)
    rundir.fsync_path(tmp)


def _exchange(a: Path, b: Path) -> bool:
    """Swap two paths atomically (Linux renameat2 RENAME_EXCHANGE); False where unsupported (NFS, ...)."""
    try:
        renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):
        return False
    renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    at_fdcwd, rename_exchange = -100, 2
    if renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOTSUP):
        return False
    raise OSError(code, os.strerror(code), str(b))


def _install(tmp: Path, final: Path) -> None:
    """Rename the finished temp dir to its final name; an existing one is replaced.

    With RENAME_EXCHANGE the final name never disappears; elsewhere the old dir is first moved
    aside (a kill in between leaves the previous step as the newest complete checkpoint).
    """
    if final.exists():
        if not _exchange(tmp, final):
            aside = _temporary(final.parent, rundir.checkpoint_step(final), "-replaced")
            _remove(aside)
            os.rename(final, aside)
            os.rename(tmp, final)
            tmp = aside
        rundir.fsync_path(final.parent)
        _remove(tmp)  # now the old checkpoint
    else:
        os.rename(tmp, final)
    rundir.fsync_path(final.parent)


def _prune(folder: Path, keep: int) -> None:
    """Delete complete checkpoint dirs beyond the newest `keep` (renamed to a temporary first)."""
    complete = [p for p in list_dcp_checkpoints(folder) if is_complete(p)]
    for old in complete[max(1, keep) :]:
        doomed = _temporary(folder, rundir.checkpoint_step(old), "-pruned")
        try:
            _remove(doomed)
            os.rename(old, doomed)
        except OSError as err:
            log.warning("could not delete old checkpoint %s: %s", old, err)
            continue
        _remove(doomed)


def _needed(folder: Path, state: Dict[str, Any], extra: Dict[str, Any]) -> int:
    """Space a checkpoint takes: the previous complete one's, or at least its tensors' bytes."""
    previous = newest_complete(folder) if folder.is_dir() else None
    return max(checkpoint_bytes(previous) if previous else 0, tensor_bytes(state) + tensor_bytes(extra))


def _describe(err: BaseException) -> str:
    """One line for an error, naming the first failing rank of a CheckpointException."""
    if isinstance(err, CheckpointException) and err.failures:
        rank, (first, _) = next(iter(sorted(err.failures.items(), key=lambda item: item[0])))
        return f"rank {rank}: {type(first).__name__}: {first}"
    return f"{type(err).__name__}: {err}"


def _own_error(err: BaseException) -> Optional[CheckpointError]:
    """The first CheckpointError (ours: a refusal, a torn file) among the failures DCP collected from all ranks."""
    if isinstance(err, CheckpointError):
        return err
    if isinstance(err, CheckpointException):
        for _, (failure, _) in sorted(err.failures.items(), key=lambda item: item[0]):
            if isinstance(failure, CheckpointError):
                return failure
    return None


def _failure(err: Optional[BaseException], step: int) -> CheckpointError:
    if err is None:
        return CheckpointError(f"checkpoint step {step} was not written: another rank failed to write it (see its log)")
    if isinstance(err, CheckpointError):
        return err
    return CheckpointError(f"checkpoint step {step} was not written: {_describe(err)}")


def _fail(
    folder: Path,
    tmp: Path,
    step: int,
    err: Optional[BaseException],
    disk_full: bool,
    needed: Callable[[], int],
    is_main: bool,
    barrier: Callable[[], None],
    agree: Callable[[bool], bool],
) -> CheckpointError:
    """All ranks: agree whether any rank's disk was full, rank 0 removes the temp dir, then the error to raise."""
    any_disk_full = agree(disk_full)
    if is_main:
        _remove(tmp)
    barrier()
    if any_disk_full:
        exc: CheckpointError = disk_full_error(folder, f"checkpoint step {step}", needed())
    else:
        exc = _failure(err, step)
    exc.__cause__ = err if isinstance(err, Exception) else None
    return exc


def save_dcp(
    state: Dict[str, Any],
    folder: Path,
    step: int,
    extra: Dict[str, Any],
    keep: int,
    is_main: bool,
    barrier: Callable[[], None],
    agree: Callable[[bool], bool],
    gather: Callable[[Any], Optional[List[Any]]],
) -> Path:
    """Write `state` as ``<folder>/step_<N:09d>/`` (a collective: every rank calls it the same way).

    `state`: what ``dcp.save`` takes (``{"model": msd, "optim": osd}`` of ``get_state_dict``).
    `extra`: rank 0's ``loop.pt`` (tensors and plain values only). `barrier` waits for every rank;
    `agree(failed)` is an all-reduce that is True on every rank if any rank passed True (so
    a rank that fails alone never leaves the others waiting); `gather(obj)` returns every
    rank's picklable `obj` in rank order on rank 0 (None elsewhere): each rank hashes the
    files it wrote and rank 0 gathers those entries for the manifest. The dir appears by one rename
    once every file and the manifest are on disk: a kill at any moment leaves the previous
    complete checkpoint the newest one. A full disk raises :class:`DiskFull` on every rank
    after rank 0 removed this save's temporary dir.
    """
    folder = Path(folder)
    tmp = _temporary(folder, step)
    final = step_dir(folder, step)

    def needed() -> int:
        return _needed(folder, state, extra)

    error: Optional[BaseException] = None
    disk_full = False
    if is_main:
        try:
            _remove(tmp)  # a stale one of a killed attempt at this step
            tmp.mkdir(parents=True)
        except OSError as err:
            error, disk_full = err, _is_disk_full(err)
    if agree(error is not None):
        raise _fail(folder, tmp, step, error, disk_full, needed, is_main, barrier, agree)
    writer = _Writer(str(tmp))
    own: Optional[Entries] = None
    try:
        dcp.save(state, checkpoint_id=str(tmp), storage_writer=writer)
        faults.slow_checkpoint_write()  # a test hook: widen the window in which a kill hits a save half-done
        own = _file_entries(tmp, writer.written)
    except (Exception, CheckpointException) as err:
        error, disk_full = err, writer.disk_full or _is_disk_full(err)
    everyone = gather(own)  # also on a rank that failed (it sends None): no rank waits for ever
    if is_main and error is None and (hashed := _merged(everyone)) is not None:
        try:
            _write_rank0_files(tmp, step, extra, hashed)
        except Exception as err:
            error, disk_full = err, _is_disk_full(err)
    if agree(error is not None):
        raise _fail(folder, tmp, step, error, disk_full, needed, is_main, barrier, agree)
    if is_main:
        try:
            _install(tmp, final)
            _prune(folder, keep)
        except OSError as err:
            error = err
    if agree(error is not None):
        raise _failure(error, step)
    return final


# -- loading -----------------------------------------------------------------------------------
def _dcp_load(state: Dict[str, Any], path: Path, no_dist: bool) -> None:
    """``dcp.load`` through the safe reader, its errors turned into one CheckpointError."""
    reader = SafeFileSystemReader(path)
    try:
        with warnings.catch_warnings():
            if no_dist:  # DCP warns "assuming the intent is to load in a single process" even when told so
                warnings.filterwarnings("ignore", message="torch.distributed is disabled")
            dcp.load(state, checkpoint_id=str(path), storage_reader=reader, no_dist=no_dist)
    except (Exception, CheckpointException) as err:
        refused = reader.refused or _own_error(err)  # another rank's refusal arrives inside DCP's exception
        if refused is not None:
            raise refused from None
        raise CheckpointError(f"cannot load checkpoint {path}: {_describe(err)}") from (
            err if isinstance(err, Exception) else None
        )


def load_dcp(state: Dict[str, Any], path: Path, deep: bool = True, peers: Optional[Peers] = None) -> None:
    """Verify the checkpoint dir `path`, then load it into `state` in place (a collective).

    `state` is what :func:`save_dcp` was given, freshly built (any sharding, any world size:
    DCP reshards). `deep` also checks the sha256 of every file, each rank hashing a share
    (`peers`: by default the default process group's ranks); `deep=False` keeps only the size
    checks (no rank reads the checkpoint for them); safety does not depend on it.
    """
    path = Path(path)
    verify(path, deep=deep, peers=(peers or _process_group_peers()) if deep else None)
    if not deep:
        read_metadata(path)  # a forged .metadata is refused here, with its own message (deep verify did it)
    _dcp_load(state, path, no_dist=False)


def read_loop(path: Path) -> Dict[str, Any]:
    """``loop.pt`` of a checkpoint dir (checked against the manifest), loaded with weights_only=True."""
    path = Path(path)
    manifest = verify(path)
    _check_file(path, LOOP, manifest["files"][LOOP], deep=True)
    loop = _weights_only((path / LOOP).read_bytes(), path, f"its {LOOP}")
    if not isinstance(loop, dict):
        raise _refused(path, f"its {LOOP} holds a {type(loop).__name__}, not a dict")
    return loop


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
    _dcp_load(state, path, no_dist=True)
    return {key[len(prefix) :]: tensor for key, tensor in state.items()}


def _check_sizes(path: Path, metadata: Metadata, entries: Dict[str, TensorStorageMetadata]) -> None:
    """Shapes and dtypes must be real, and no larger than the data files hold (no memory bomb)."""
    total = 0
    for key, entry in entries.items():
        dtype, size = getattr(entry.properties, "dtype", None), getattr(entry, "size", None)
        real = isinstance(size, tuple) and all(isinstance(n, int) and n >= 0 for n in size)
        if not isinstance(dtype, torch.dtype) or not real:
            raise _refused(path, f"its .metadata describes {key} with dtype {dtype!r} and size {size!r}")
        total += torch.Size(size).numel() * dtype.itemsize
    stored = sum((path / name).stat().st_size for name in _referenced_files(metadata))
    if total > stored:
        raise _refused(path, f"its .metadata describes {total} bytes of weights in {stored} bytes of data files")
