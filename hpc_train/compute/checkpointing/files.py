"""Checkpoint files: atomic writes, verified reads, rotation, and the config fingerprint; the errors of both formats.

A checkpoint is ``rundir.checkpoint_path(run_dir, step)``: a header line
(``HPCTRAIN-CKPT 2 <sha256 of the rest>``), a line with the config fingerprint as JSON (so the
login node can check compatibility without torch), then a ``torch.save`` payload. The digest
lets a reader tell a complete file from a torn or corrupt one; files are written through a
temporary name, flushed, fsynced and renamed, so the newest name on disk is always whole.
Read one with :func:`read_checkpoint` (``torch.load`` does not understand the header).

Untrusted files: ``resume=`` may point into another user's directory, and a valid digest only
proves the file is whole, not who wrote it. So every payload is loaded with
``torch.load(weights_only=True)``, which builds tensors and plain containers and never calls
anything named in the file; everything saved is made of those (RNG states included: see
:func:`capture_rng`). A payload that needs more is refused (:class:`CheckpointRefused`), never
retried with ``weights_only=False``. Format 1 (before this rule) stored numpy arrays and is
refused with a message saying it comes from an older hpc-train.

The errors of both formats (single files here, DCP dirs in the dcp_*.py modules) are defined
here, one place to catch them from: :class:`CheckpointError` and its kinds (refused, unsafe,
incomplete, disk full).

Payload keys: ``format``, ``fingerprint``, ``state`` (epoch, step_in_epoch, global_step,
last_loss), ``shards`` (model / optimizer / GradScaler state per parameter owner: ``"model"``
for replicated strategies, ``"stage<s>"`` for the pipelining engine), ``scheduler``, ``rng``
(python, numpy, torch and CUDA RNG states of every rank, by rank, as tensors and plain numbers)
and ``world_size``.
"""

from __future__ import annotations

import errno
import hashlib
import io
import json
import logging
import pickle
import random
import re
import shutil
from pathlib import Path
from typing import Any, Callable, Dict, Optional, Tuple

import numpy as np
import torch

from hpc_train import errors
from hpc_train.compute.runtime import faults
from hpc_train.compute.runtime.refusal import Refusal
from hpc_train.records import rundir
from hpc_train.sizes import size_text

log = logging.getLogger("hpc_train")

MAGIC = b"HPCTRAIN-CKPT"
FORMAT = 2  # 2: loadable with weights_only=True (format 1 pickled numpy RNG states)


class CheckpointError(errors.HpcTrainError, RuntimeError):
    """A checkpoint that cannot be used: unreadable, corrupt, or from an incompatible run."""


class CheckpointRefused(CheckpointError, Refusal):
    """A whole checkpoint this version will not load (unsafe content, other format, other settings).

    Not skipped in favour of an older checkpoint, as a torn file is: the user has to decide.
    """


class DiskFull(CheckpointError, Refusal, errors.DiskFull):
    """A checkpoint could not be written for lack of space (ENOSPC/EDQUOT); the previous one stays.

    A :class:`Refusal` (exit code hpc_train.records.rundir.EXIT_REFUSED, one message, no traceback): the
    user has to free space, there is nothing to debug. The run resumes from the previous
    checkpoint when the same command runs again.
    """


class UnsafeCheckpoint(CheckpointRefused):
    """A checkpoint that would run code if loaded the ordinary way; nothing in it was run.

    A :class:`CheckpointRefused` (so a :class:`Refusal`): never skipped in favour of an older
    checkpoint, the user decides.
    """


class IncompleteCheckpoint(CheckpointError):
    """A checkpoint dir that is missing files, truncated or corrupt (a kill, a full disk, bit rot).

    Like a torn checkpoint file, it may be skipped in favour of the previous complete one.
    """


def refusal_message(path: Path, what: str) -> str:
    """The one message for a checkpoint holding `what` hpc-train never writes: nothing in it was run, and the fix."""
    return (
        f"refusing to load checkpoint {path}: {what}, which hpc-train never writes; it may have been tampered"
        " with. Nothing in it was run. Fix: resume from a checkpoint you trust, or start over with resume=never"
        " or a new hydra.run.dir."
    )


def unsafe_checkpoint(path: Path, what: str) -> UnsafeCheckpoint:
    """The refusal of a checkpoint (dir) whose `what` would run code if loaded the ordinary way."""
    return UnsafeCheckpoint(refusal_message(path, what))


DISK_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)


def is_disk_full(err: Optional[BaseException]) -> bool:
    """Whether `err` comes from a full disk: ENOSPC or EDQUOT anywhere in its chain (torch.save's zip writer raises a
    RuntimeError whose ``__context__`` is the OSError) or among the failures a DCP collective gathered from every rank
    (``CheckpointException.failures``: rank -> (error, traceback)). The one test of both checkpoint formats."""
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
        failures = getattr(exc, "failures", None)
        if isinstance(failures, dict):
            todo += [failure[0] if isinstance(failure, tuple) else failure for failure in failures.values()]
    return False


RESUME_AFTER_FREEING = (
    "The previous checkpoint is kept and stays the resume target. Fix: free space on that file system or lower"
    " trainer.keep_checkpoints, then resume from it as the job's last line says."
)


def disk_full_error(folder: Path, what: str, needed: int, after: str = RESUME_AFTER_FREEING) -> DiskFull:
    """The one message for a full disk: where, how much `what` needs, how much is free, what to do (`after`)."""
    try:
        free = size_text(shutil.disk_usage(folder).free)
    except OSError:
        free = "unknown"
    return DiskFull(
        f"no space left for {what} in {folder}: it needs about {size_text(needed)}, {free} free there. {after}"
    )


# -- atomic files ---------------------------------------------------------------------------
def save_atomic(obj: Any, path: Path, what: str, after: str = RESUME_AFTER_FREEING) -> None:
    """``torch.save`` with the atomic write above (final weights, per-stage weights, an export); a full disk is
    :class:`DiskFull` naming `what`, with `after` as its fix."""
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    try:
        rundir.write_bytes_atomic(buffer.getvalue(), path, halfway=faults.slow_checkpoint_write)
    except Exception as err:
        if is_disk_full(err):
            raise disk_full_error(path.parent, what, buffer.getbuffer().nbytes, after) from None
        raise


# -- checkpoint files -----------------------------------------------------------------------
_TENSOR_WRITE = 4096  # torch.save writes a tensor's bytes in one call; its other writes are a few bytes each


def _nothing() -> None:
    pass


class _HashingWriter:
    """Writes through to a file and hashes what passes: a checkpoint is hashed as it is written, never held in memory
    as a whole (torch.save needs ``write`` and ``flush`` only)."""

    def __init__(self, handle: Any) -> None:
        self.handle, self.digest, self.size = handle, hashlib.sha256(), 0
        self.check: Callable[[], None] = _nothing

    def write(self, data: Any) -> int:
        view = memoryview(data)
        if view.nbytes >= _TENSOR_WRITE:
            check, self.check = self.check, _nothing
            check()  # a test hook (faults.disk_full_at): the first tensor's write fails as on a full disk, once
        self.digest.update(view)
        self.size += view.nbytes
        return self.handle.write(view)

    def flush(self) -> None:
        self.handle.flush()


def _header(digest: str) -> bytes:
    return b"%s %d %s\n" % (MAGIC, FORMAT, digest.encode())


def write_checkpoint(payload: Dict[str, Any], path: Path, keep: int) -> None:
    """Write `payload` atomically, then delete all but the newest `keep` checkpoints beside it.

    Streamed: the header's place is kept (its length is fixed), the body is serialized straight into the file and
    hashed on the way, then the header is written over its place; the file is flushed, fsynced and renamed. A full
    disk at any point of it (wherever the error surfaces: see is_disk_full) is :class:`DiskFull`, the temporary file
    removed and the previous checkpoint kept."""
    placeholder = _header("0" * 64)  # the header's fixed length, written over once the body's digest is known
    step = rundir.checkpoint_step(path) or 0
    written = _HashingWriter(None)

    def write(handle: Any) -> None:
        handle.write(placeholder)
        written.handle = handle
        written.write(json.dumps(payload["fingerprint"]).encode() + b"\n")
        written.check = lambda: faults.disk_full_at("write", step)  # a test hook: a write inside torch.save's stream
        torch.save(payload, written)
        faults.slow_checkpoint_write()  # a test hook: widen the window in which a kill hits the write
        handle.seek(0)
        faults.disk_full_at("header", step)
        handle.write(_header(written.digest.hexdigest()))

    try:
        rundir.write_atomic(path, write, before=lambda point: faults.disk_full_at(point, step))
    except Exception as err:
        rundir.remove_stale_temporaries(path.parent)  # this write's temporary file (the only writer: rank 0)
        if is_disk_full(err):
            previous = [p.stat().st_size for p in rundir.list_checkpoints(path.parent)[:1]]
            needed = max([len(placeholder) + written.size, *previous])
            raise disk_full_error(path.parent, f"checkpoint {path.name}", needed) from None
        raise
    for old in rundir.list_checkpoints(path.parent)[max(1, keep) :]:
        try:
            old.unlink()
        except OSError:
            pass


def read_checkpoint(path: Path) -> Dict[str, Any]:
    """Load and verify one checkpoint file; raises CheckpointError if it is torn or corrupt."""
    try:
        data = Path(path).read_bytes()
    except OSError as err:
        raise CheckpointError(f"cannot read {path}: {err}") from err
    newline = data.find(b"\n")
    fields = data[:newline].split() if newline > 0 else []
    if len(fields) != 3 or fields[0] != MAGIC:
        raise CheckpointError(f"{path} is not an hpc-train checkpoint (bad header)")
    body = data[newline + 1 :]
    if hashlib.sha256(body).hexdigest().encode() != fields[2]:
        raise CheckpointError(
            f"{path} is truncated or corrupt (its checksum does not match; {len(body)} payload bytes)"
        )
    check_format(path, fields[1])
    try:
        start = body.index(b"\n") + 1  # after the fingerprint line (the payload holds it too)
    except ValueError as err:
        raise CheckpointError(f"{path} has no fingerprint line") from err
    try:
        return torch.load(io.BytesIO(body[start:]), map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as err:  # something other than tensors and plain types: never run it
        raise CheckpointRefused(
            refusal_message(path, f"it holds objects other than tensors and plain values ({unsafe_load_reason(err)})")
        ) from None
    except Exception as err:  # a valid digest of an unloadable payload: a different torch, say
        raise CheckpointError(f"{path} could not be unpickled: {err}") from err


def check_format(path: Path, version: bytes) -> None:
    """Refuse another format version (the header's second field) before unpickling anything."""
    try:
        found = int(version)
    except ValueError:
        raise CheckpointError(f"{path} is not an hpc-train checkpoint (bad format version {version!r})") from None
    if found == FORMAT:
        return
    who = "an older" if found < FORMAT else "a newer"
    raise CheckpointRefused(
        f"checkpoint {path} was written by {who} hpc-train (checkpoint format {found}; this version reads format"
        f" {FORMAT}) and cannot be loaded. Fix: start this run over with resume=never (old checkpoints are moved aside)"
        " or a new hydra.run.dir"
        + (", or finish it with the hpc-train version that wrote it." if found < FORMAT else ", or upgrade hpc-train.")
    )


def unsafe_load_reason(err: Exception) -> str:
    """The telling part of torch's long weights_only error, e.g. ``Unsupported global: GLOBAL builtins.open``
    (both checkpoint formats refuse with it)."""
    text = str(err)
    match = re.search(r"WeightsUnpickler error: (.*?)(?: was not an allowed global| Please|$)", text, flags=re.M)
    if match:
        return match.group(1)[:200]
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    telling = [line for line in lines if "GLOBAL" in line] or lines or [type(err).__name__]
    return telling[0][:200]


def newest_valid(folder: Path) -> Tuple[Optional[Path], Optional[Dict[str, Any]]]:
    """The newest checkpoint in `folder` that verifies; corrupt newer ones are skipped with a warning."""
    for path in rundir.list_checkpoints(folder):
        try:
            return path, read_checkpoint(path)
        except CheckpointRefused:
            raise
        except CheckpointError as err:
            log.warning("skipping checkpoint: %s; falling back to the previous one", err)
    return None, None


# -- RNG states -----------------------------------------------------------------------------
def capture_rng() -> Dict[str, Any]:
    """This process's RNG states as tensors and plain numbers (what ``weights_only=True`` loads)."""
    version, words, gauss = random.getstate()
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    assert kind == "MT19937", kind
    state = {
        "python": {"version": int(version), "words": torch.tensor(words, dtype=torch.int64), "gauss": gauss},
        "numpy": {
            "keys": torch.from_numpy(keys.astype(np.int64)),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "cached_gaussian": float(cached),
        },
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng(state: Dict[str, Any]) -> None:
    """Put back what :func:`capture_rng` took."""
    py = state["python"]
    random.setstate((py["version"], tuple(int(w) for w in py["words"].tolist()), py["gauss"]))
    npy = state["numpy"]
    np.random.set_state(
        ("MT19937", npy["keys"].numpy().astype(np.uint32), npy["pos"], npy["has_gauss"], npy["cached_gaussian"])
    )
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        cuda_states = state["cuda"]
        if len(cuda_states) == torch.cuda.device_count():
            torch.cuda.set_rng_state_all(cuda_states)
        else:
            log.warning(
                "the checkpoint has CUDA RNG states of %d GPUs, this node sees %d: CUDA RNG not restored",
                len(cuda_states),
                torch.cuda.device_count(),
            )


def to_cpu(obj: Any) -> Any:
    """A copy of nested containers with every tensor moved to the CPU (for gathering and saving)."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().cpu()
    if isinstance(obj, dict):
        return {k: to_cpu(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(to_cpu(v) for v in obj)
    return obj


def size_on_disk(path: Path) -> int:
    """Bytes of a checkpoint file, or of every file of a checkpoint directory (0 when it is gone)."""
    path = Path(path)
    try:
        if path.is_dir():
            return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
        return path.stat().st_size
    except OSError:
        return 0
