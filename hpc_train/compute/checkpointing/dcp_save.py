"""Writes a sharded checkpoint dir (``torch.distributed.checkpoint``, DCP) as one collective, so that no rank
waits for ever when another fails and a kill at any moment leaves the previous checkpoint the newest one.

``strategy=fsdp`` saves one *directory* per checkpoint instead of one file, every rank writing
its own shards. Layout (``<run dir>/checkpoints/``)::

    step_000000010/            a complete checkpoint (appears only by an atomic rename)
      .metadata                DCP's index of every entry: pickle, read with an allow-list
      __<r>_0.distcp           rank r's shards: torch.save'd tensors and small plain values
      loop.pt                  rank 0: loop state, RNG states per rank, fingerprint (weights_only)
      manifest.json            written last: size and sha256 of every other file of the dir
    .step_000000011.dcp.tmp/   a save in progress, or one a kill interrupted (removed on restart)

How each part is read back safely: hpc_train.compute.checkpointing.dcp_load; the manifest:
dcp_manifest; the dirs, their install and pruning: dcp_dirs.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.filesystem import FileSystemWriter
from torch.distributed.checkpoint.metadata import Metadata

from hpc_train.compute.checkpointing.dcp_dirs import (
    checkpoint_bytes,
    install,
    newest_complete,
    prune,
    step_dir,
    temporary,
)
from hpc_train.compute.checkpointing.dcp_failures import describe
from hpc_train.compute.checkpointing.dcp_manifest import LOOP, Entries, file_entries, merged_entries, write_manifest
from hpc_train.compute.checkpointing.files import CheckpointError, disk_full_error, is_disk_full
from hpc_train.compute.runtime import faults
from hpc_train.records import rundir


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
            self.disk_full = self.disk_full or is_disk_full(err)
            raise

    def finish(self, metadata: Metadata, results: Any) -> None:
        try:
            super().finish(metadata, results)
        except BaseException as err:
            self.disk_full = self.disk_full or is_disk_full(err)
            raise


def _write_rank0_files(tmp: Path, step: int, extra: Dict[str, Any], hashed: Optional[Entries] = None) -> None:
    """loop.pt, then the manifest (`hashed`: the shard entries the ranks gathered), then the dir synced."""
    buffer = io.BytesIO()
    torch.save(extra, buffer)
    rundir.write_durable(tmp / LOOP, buffer.getvalue())
    faults.disk_full_at("manifest", step)
    write_manifest(tmp, step, extra, hashed)
    rundir.fsync_path(tmp)


def tensor_bytes(obj: Any) -> int:
    """Bytes of the tensors in nested containers (a DTensor counts its global size)."""
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, dict):
        return sum(tensor_bytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(tensor_bytes(v) for v in obj)
    return 0


def _needed(folder: Path, state: Dict[str, Any], extra: Dict[str, Any]) -> int:
    """Space a checkpoint takes: the previous complete one's, or at least its tensors' bytes."""
    previous = newest_complete(folder) if folder.is_dir() else None
    return max(checkpoint_bytes(previous) if previous else 0, tensor_bytes(state) + tensor_bytes(extra))


def _failure(err: Optional[BaseException], step: int) -> CheckpointError:
    if err is None:
        return CheckpointError(f"checkpoint step {step} was not written: another rank failed to write it (see its log)")
    if isinstance(err, CheckpointError):
        return err
    return CheckpointError(f"checkpoint step {step} was not written: {describe(err)}")


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
        rundir.remove_path(tmp)
    barrier()
    if any_disk_full:
        exc: CheckpointError = disk_full_error(folder, f"checkpoint step {step}", needed())
    else:
        exc = _failure(err, step)
    exc.__cause__ = err if isinstance(err, Exception) else None
    return exc


class _CollectiveSave:
    """One save's dirs and this rank's first error; after each step every rank agrees whether any rank failed, and
    then all go on or all raise."""

    def __init__(
        self,
        folder: Path,
        step: int,
        is_main: bool,
        barrier: Callable[[], None],
        agree: Callable[[bool], bool],
        needed: Callable[[], int],
    ) -> None:
        self.folder, self.step, self.is_main = folder, step, is_main
        self.tmp, self.final = temporary(folder, step), step_dir(folder, step)
        self.barrier, self.agree, self.needed = barrier, agree, needed
        self.error: Optional[BaseException] = None
        self.disk_full = False

    def failed(self, err: BaseException, disk_full: Optional[bool] = None) -> None:
        self.error, self.disk_full = err, is_disk_full(err) if disk_full is None else disk_full

    def agreed(self) -> None:
        """Every rank: on, or (when any rank failed) the error raised after rank 0 removed the temporary dir."""
        if self.agree(self.error is not None):
            raise _fail(
                self.folder,
                self.tmp,
                self.step,
                self.error,
                self.disk_full,
                self.needed,
                self.is_main,
                self.barrier,
                self.agree,
            )


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
    process_group: Any = None,
) -> Path:
    """Write `state` as ``<folder>/step_<N:09d>/`` (a collective: every rank calls it the same way).

    `state`: what ``dcp.save`` takes (``{"model": msd, "optim": osd}`` of ``get_state_dict``).
    `extra`: rank 0's ``loop.pt`` (tensors and plain values only). `barrier` waits for every rank;
    `agree(failed)` is an all-reduce that is True on every rank if any rank passed True (so
    a rank that fails alone never leaves the others waiting); `gather(obj)` returns every
    rank's picklable `obj` in rank order on rank 0 (None elsewhere): each rank hashes the
    files it wrote and rank 0 gathers those entries for the manifest; `process_group`: the group DCP plans on
    (None: the default one; a save written in the background passes the group its other collectives use). The
    dir appears by one rename once every file and the manifest are on disk: a kill at any moment leaves the previous
    complete checkpoint the newest one. A full disk raises :class:`DiskFull` on every rank
    after rank 0 removed this save's temporary dir.
    """
    folder = Path(folder)
    save = _CollectiveSave(folder, step, is_main, barrier, agree, needed=lambda: _needed(folder, state, extra))
    if is_main:
        _make_temporary(save)
    save.agreed()
    everyone = gather(_write_shards(save, state, process_group))  # also on a rank that failed: no rank waits for ever
    if is_main and save.error is None and (hashed := merged_entries(everyone)) is not None:
        _write_rank0_files_of(save, extra, hashed)
    save.agreed()
    if is_main:
        _install(save)
    save.agreed()
    if is_main:
        prune(folder, keep)  # logs what it cannot delete: the checkpoint is installed
    return save.final


def _make_temporary(save: _CollectiveSave) -> None:
    """Rank 0: the save's temporary dir, new (a stale one of a killed attempt at this step removed)."""
    try:
        rundir.remove_path(save.tmp)
        save.tmp.mkdir(parents=True)
    except OSError as err:
        save.failed(err)


def _write_shards(save: _CollectiveSave, state: Dict[str, Any], process_group: Any) -> Optional[Entries]:
    """Every rank's shards written by DCP into the temporary dir; the entries of the files this rank wrote (None when
    it failed)."""
    writer = _Writer(str(save.tmp))
    try:
        dcp.save(state, checkpoint_id=str(save.tmp), storage_writer=writer, process_group=process_group)
        faults.slow_checkpoint_write()  # a test hook: widen the window in which a kill hits a save half-done
        return file_entries(save.tmp, writer.written)
    except (Exception, CheckpointException) as err:
        save.failed(err, writer.disk_full or is_disk_full(err))
        return None


def _write_rank0_files_of(save: _CollectiveSave, extra: Dict[str, Any], hashed: Entries) -> None:
    """Rank 0, once every rank wrote its shards: loop.pt and the manifest of them all."""
    try:
        _write_rank0_files(save.tmp, save.step, extra, hashed)
    except Exception as err:
        save.failed(err)


def _install(save: _CollectiveSave) -> None:
    """Rank 0: the complete temporary dir renamed to the step's dir."""
    try:
        faults.disk_full_at("install", save.step)
        install(save.tmp, save.final)
    except OSError as err:
        save.failed(err)
