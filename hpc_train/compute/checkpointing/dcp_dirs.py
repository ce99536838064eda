"""The ``step_<N>/`` dirs of a checkpoints folder (names, listing, installing a finished save by an atomic
rename, pruning, size), so that a kill at any moment leaves the newest complete checkpoint in place; and the
checkpoints folder moved aside whole (``resume=never``). Every rename of a checkpoint directory is here (a file's
goes through hpc_train.records.rundir.write_atomic).

A save writes into ``.step_<N>.dcp.tmp/`` and renames it to ``step_<N>/`` once complete; a replaced
or pruned dir is renamed to ``.step_<N>.dcp.tmp-replaced`` / ``-pruned`` before it is deleted. What
a kill leaves of those is removed at the next start (hpc_train.records.rundir.remove_stale_temporaries).
"""

from __future__ import annotations

import ctypes
import errno
import logging
import os
import time
from pathlib import Path
from typing import List, Optional

from hpc_train.compute.checkpointing.dcp_manifest import is_complete, verify
from hpc_train.compute.checkpointing.files import CheckpointError
from hpc_train.records import rundir

log = logging.getLogger("hpc_train")

# Temporaries of both formats: ".step_000000010.dcp.tmp" (this module, also "-replaced"/"-pruned")
# and ".step_000000010.ckpt.tmp<host>.<pid>.<random>" (rundir.write_atomic, under files.write_checkpoint, for
# single-file checkpoints).


def step_dir(folder: Path, step: int) -> Path:
    return Path(folder) / rundir.step_name(step)


def temporary(folder: Path, step: int, why: str = "") -> Path:
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


def install(tmp: Path, final: Path) -> None:
    """Rename the finished temp dir to its final name; an existing one is replaced.

    With RENAME_EXCHANGE the final name never disappears; elsewhere the old dir is first moved
    aside (a kill in between leaves the previous step as the newest complete checkpoint).
    """
    if final.exists():
        if not _exchange(tmp, final):
            aside = temporary(final.parent, rundir.checkpoint_step(final), "-replaced")
            rundir.remove_path(aside)
            os.rename(final, aside)
            os.rename(tmp, final)
            tmp = aside
        rundir.fsync_path(final.parent)
        rundir.remove_path(tmp)  # now the old checkpoint
    else:
        os.rename(tmp, final)
    rundir.fsync_path(final.parent)


def prune(folder: Path, keep: int) -> None:
    """Delete complete checkpoint dirs beyond the newest `keep` (renamed to a temporary first)."""
    complete = [p for p in list_dcp_checkpoints(folder) if is_complete(p)]
    for old in complete[max(1, keep) :]:
        doomed = temporary(folder, rundir.checkpoint_step(old), "-pruned")
        try:
            rundir.remove_path(doomed)
            os.rename(old, doomed)
        except OSError as err:
            log.warning("could not delete old checkpoint %s: %s", old, err)
            continue
        rundir.remove_path(doomed)


def set_aside(folder: Path) -> Path:
    """The checkpoints folder renamed whole to ``<folder>.replaced-<time>`` (resume=never: kept, never deleted);
    the new name."""
    folder = Path(folder)
    aside = folder.with_name(f"{folder.name}.replaced-{time.strftime('%Y%m%d-%H%M%S')}")
    os.rename(folder, aside)
    rundir.fsync_path(folder.parent)
    return aside
