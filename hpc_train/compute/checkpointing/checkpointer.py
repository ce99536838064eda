"""Save a training run's full state and put it back: what makes a resumed run exact.

The trainer hands the checkpointer the objects that hold state, each with ``state_dict`` and
``load_state_dict`` (torch.distributed.checkpoint's ``Stateful`` protocol): *sharded* ones (model,
optimizer, GradScaler), whose content differs between parameter owners (the first replica of every
pipeline stage), and *shared* ones (LR schedule, loop position), equal on every rank and saved by
rank 0, and *per-rank* ones (a stream's read position), saved for every rank. Every rank adds its
RNG states. Rank 0 gathers the parts over the CPU control group and writes one file
(hpc_train.compute.checkpointing.files); on resume every rank reads the same file, checks the
fingerprint, and loads its own part.

Written in the loop or in the background (``trainer.async_checkpoint``): in the background the loop only waits
while the state is staged (hpc_train.compute.checkpointing.staging), and a thread (background.py) writes it;
:meth:`Checkpointer.finished`, called at step boundaries, says when it is done or raises its error on every rank.

Resume modes (the top-level ``resume`` key; targets resolved by hpc_train.records.rundir):
  * ``auto``: the newest checkpoint of the run dir that verifies (a torn or corrupt newest one
    is skipped with a warning); none: start from scratch.
  * ``never``: start from scratch; existing checkpoints are moved aside to
    ``checkpoints.replaced-<time>/`` (never deleted).
  * a path: that checkpoint file, or the newest valid one of a run dir / checkpoints folder.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Dict, Mapping, Optional, Tuple

from hpc_train.compute.checkpointing.background import FAILURE_WAIT_S, BackgroundWrite, Ticket
from hpc_train.compute.checkpointing.files import (
    FORMAT,
    CheckpointError,
    DiskFull,
    capture_rng,
    newest_valid,
    read_checkpoint,
    restore_rng,
    to_cpu,
    write_checkpoint,
)
from hpc_train.compute.checkpointing.staging import Stager
from hpc_train.compute.runtime import distributed
from hpc_train.compute.runtime.ranks import RankInfo
from hpc_train.contracts.fingerprint import differences
from hpc_train.records import rundir

if TYPE_CHECKING:  # only named in annotations: importing torch.distributed.checkpoint costs about a second per rank
    from torch.distributed.checkpoint.stateful import Stateful

log = logging.getLogger("hpc_train")


@dataclass(frozen=True)
class CheckpointSettings:
    """The trainer keys of checkpointing: every how many steps, how many are kept, whether saves are written in the
    background. (How often a stopped job is requeued, ``trainer.max_requeues``, is read from the spec after training
    has stopped: hpc_train.compute.worker.)"""

    checkpoint_every: int
    keep_checkpoints: int
    async_checkpoint: bool


class Checkpointer:
    """Writes and finds checkpoints of the state holders it is given (every method is called on every rank).

    `resume` is the top-level ``resume`` key (see the module doc)."""

    def __init__(
        self,
        run_dir: Path,
        ranks: RankInfo,
        fingerprint: Dict[str, Any],
        sharded: Mapping[str, Stateful],
        shared: Mapping[str, Stateful],
        per_rank: Mapping[str, Stateful],
        shard_key: str,
        owns_shard: bool,
        settings: CheckpointSettings,
        resume: str,
    ) -> None:
        self.run_dir = Path(run_dir)
        self.ranks = ranks
        self.fingerprint = fingerprint
        self.sharded = {k: v for k, v in sharded.items() if v is not None}
        self.shared = dict(shared)
        self.per_rank = dict(per_rank)  # each rank's own (a stream's read position), saved for every rank
        self.shard_key, self.owns_shard = shard_key, owns_shard
        self.every, self.keep, self.resume = int(settings.checkpoint_every), int(settings.keep_checkpoints), str(resume)
        self.folder = rundir.checkpoint_dir(run_dir)
        self.last_saved_step: Optional[int] = None
        self.resharded_from: Optional[int] = None  # the world size that wrote the checkpoint, when another one
        self.background = bool(settings.async_checkpoint)
        self.stager = Stager()
        self.in_flight: Optional[BackgroundWrite] = None  # the save being written in the background

    # -- saving -------------------------------------------------------------------------
    def due(self, global_step: int) -> bool:
        return self.every > 0 and global_step % self.every == 0

    def save(self, global_step: int, why: str) -> Optional[Ticket]:
        """Checkpoint the current state (a collective: every rank calls it); None when this step has one already.

        Synchronous: written and installed when this returns. In the background (``trainer.async_checkpoint``): the
        state is staged (copied to CPU memory) and written by a thread; :meth:`finished` says when it is done. The
        caller has collected the previous save first (at most one is in flight)."""
        if self.last_saved_step == global_step:
            return None
        assert self.in_flight is None, "the previous checkpoint is still being written"
        started = time.perf_counter()
        path, write = self._prepare(global_step, why)
        ticket = Ticket(global_step, path, background=self.background, started=started)
        if self.background:
            self.in_flight = BackgroundWrite(ticket, write)
        else:
            write()
        self.last_saved_step = global_step
        return ticket

    def finished(self, wait: bool) -> Optional[Ticket]:
        """The save in flight, once it is written on every rank (None while it is not, or when none is in flight);
        `wait`: block until it is. A collective while a save is in flight, so every rank calls it at the same
        points of the loop. A save that failed on any rank raises its error on every rank."""
        flight = self.in_flight
        if flight is None:
            return None
        if wait:
            flight.wait()
        running, failed = distributed.all_reduce_max_ints([int(not flight.done()), int(flight.error is not None)])
        if failed:
            self.in_flight = None
            raise self._background_error(flight)
        if running:
            return None
        self.in_flight = None
        return flight.ticket

    def finish_on_failure(self) -> None:
        """The run is failing on this rank: let the save in flight finish (no collective; at most FAILURE_WAIT_S), so
        that the state it staged becomes the resume target; one that does not finish is removed at the next start."""
        flight, self.in_flight = self.in_flight, None
        if flight is None:
            return
        if flight.wait(FAILURE_WAIT_S) and flight.error is None:
            log.info("the checkpoint of step %d, written in the background, was completed", flight.ticket.step)
        else:
            log.warning("the checkpoint of step %d, written in the background, was not completed", flight.ticket.step)

    def _background_error(self, flight: BackgroundWrite) -> BaseException:
        """This rank's own error, else rank 0's (the writer of a single-file checkpoint) as a CheckpointError."""
        main = distributed.broadcast_from_main(
            None if flight.error is None else (isinstance(flight.error, DiskFull), str(flight.error))
        )
        if flight.error is not None:
            return flight.error
        if main is None:
            return CheckpointError(
                f"checkpoint step {flight.ticket.step} was not written: another rank failed to write it (see its log)"
            )
        disk_full, message = main
        return DiskFull(message) if disk_full else CheckpointError(message)

    def _copy(self, state: Any) -> Any:
        """A state dict as it is saved: staged (a copy training cannot change) when written in the background,
        moved to the CPU when written now."""
        return self.stager.stage(state) if self.background else to_cpu(state)

    def _prepare(self, global_step: int, why: str) -> Tuple[Path, Callable[[], None]]:
        """Gather what the checkpoint holds (blocking); the file it becomes and the write, run now or in the
        background. Rank 0 writes the one file; a synchronous save ends with every rank waiting for it."""
        part = self._rank_part()
        shard = (
            {name: self._copy(holder.state_dict()) for name, holder in self.sharded.items()}
            if self.owns_shard
            else None
        )
        if shard is not None and not self.ranks.is_main:  # another stage's owner (the pipelining engine) sends its own
            part["shard"] = (self.shard_key, shard)
        parts = distributed.gather_to_main(part)  # rank 0's shard stays out: it would be pickled to itself
        path = rundir.checkpoint_path(self.run_dir, global_step)
        if parts is None:  # not rank 0: nothing to write
            return path, (lambda: None) if self.background else distributed.control_barrier
        payload = {
            "format": FORMAT,
            "fingerprint": self.fingerprint,
            **{name: self._copy(holder.state_dict()) for name, holder in self.shared.items()},
            "rng": [p["rng"] for p in parts],
            "per_rank": [p.get("own", {}) for p in parts],
            "shards": {**dict(p["shard"] for p in parts if "shard" in p), **({self.shard_key: shard} if shard else {})},
            "world_size": self.ranks.world_size,
            "written": time.time(),
            "why": why,
        }
        started = time.perf_counter()

        def write() -> None:
            write_checkpoint(payload, path, self.keep)
            log.info(
                "checkpoint %s written (%s, step %d, %.2f s%s)",
                path.name,
                why,
                global_step,
                time.perf_counter() - started,
                ", in the background" if self.background else "",
            )
            if not self.background:
                # No rank moves on (or exits after a stop signal, which under srun --kill-on-bad-exit would kill
                # rank 0 mid-write) before the file is complete.
                distributed.control_barrier()

        return path, write

    def _rank_part(self) -> Dict[str, Any]:
        """What every rank contributes to a checkpoint: its RNG states and its per-rank holders' state."""
        part: Dict[str, Any] = {"rng": capture_rng()}
        if self.per_rank:
            part["own"] = {name: self._copy(holder.state_dict()) for name, holder in self.per_rank.items()}
        return part

    # -- loading ------------------------------------------------------------------------
    def find(self) -> Tuple[Optional[Path], Optional[Dict[str, Any]]]:
        """The checkpoint this run resumes from, per the ``resume`` key."""
        self._remove_stale_temporaries()
        target = rundir.resume_target(self.resume, self.run_dir)
        if target is None:  # resume=never
            if self.ranks.is_main and rundir.list_checkpoints(self.folder):
                from hpc_train.compute.checkpointing import dcp_dirs  # torch.distributed.checkpoint: DCP jobs only

                aside = dcp_dirs.set_aside(self.folder)
                log.warning("resume=never: the existing checkpoints were moved to %s", aside)
            return None, None
        if target.is_dir() or self.resume == "auto":
            path, payload = newest_valid(target)
            if path is None and self.resume != "auto":
                raise CheckpointError(f"resume={self.resume}: no valid checkpoint in {target}")
        else:
            path, payload = target, read_checkpoint(target)
        self._agree(payload)
        if payload is not None:
            self._check_fingerprint(path, payload)
            payload["path"] = str(path)
        return path, payload

    may_change = ""  # what a checkpoint of this kind lets change, for the refusal's fix

    def _check_fingerprint(self, path: Path, payload: Dict[str, Any]) -> None:
        changed = differences(payload["fingerprint"], self.fingerprint)
        if changed:
            raise CheckpointError(
                f"checkpoint {path} comes from an incompatible run:\n  "
                + "\n  ".join(changed)
                + f"\nFix: run with the checkpoint's settings{self.may_change}, or start over with resume=never or a"
                " fresh hydra.run.dir."
            )

    def _remove_stale_temporaries(self) -> None:
        """Rank 0 deletes what a killed write left (before any rank can start a new one)."""
        if self.ranks.is_main:
            for stale in rundir.remove_stale_temporaries(self.folder):
                log.info("removed %s, left by a checkpoint write that was interrupted", stale.name)
        distributed.control_barrier()

    def _agree(self, payload: Optional[Dict[str, Any]]) -> None:
        """Every rank must have picked the same checkpoint (a shared file system can lag)."""
        step = -1 if payload is None else int(payload["state"]["global_step"])
        highest = distributed.all_reduce_max_int(step)
        lowest = -distributed.all_reduce_max_int(-step)
        if highest != lowest:
            raise CheckpointError(
                f"ranks found different checkpoints to resume from (steps {lowest} to {highest}): is the run dir on a"
                " shared file system?"
            )

    def _restore_rank_parts(self, payload: Dict[str, Any], path_name: str) -> None:
        """This rank's own part of `payload` (its per-rank holders, its RNG states) and the resume position; at
        another world size (a sharded checkpoint, or ddp's one replica) the ranks that did not exist keep fresh
        streams, and a stream's read position gives way to re-reading and skipping."""
        saved_world, rank = int(payload.get("world_size", self.ranks.world_size)), self.ranks.rank
        if saved_world != self.ranks.world_size:
            self.resharded_from = saved_world
            if self.ranks.is_main:
                log.warning(
                    "resharding: checkpoint %s was written by %d ranks and is resumed by %d (parameters, optimizer"
                    " state and the data position carry over; per-rank random streams restart for new ranks)",
                    Path(path_name).name,
                    saved_world,
                    self.ranks.world_size,
                )
        elif self.per_rank:
            own = payload["per_rank"][rank]
            for name, holder in self.per_rank.items():
                if name in own:
                    holder.load_state_dict(own[name])
        if rank < len(payload["rng"]):
            restore_rng(payload["rng"][rank])
        self.last_saved_step = int(payload["state"]["global_step"])

    def restore(self, payload: Dict[str, Any]) -> None:
        """Load every state holder's part of `payload`, and this rank's RNG states."""
        if self.shard_key not in payload["shards"]:
            raise CheckpointError(
                f"the checkpoint has no parameters for {self.shard_key} (it has {sorted(payload['shards'])})"
            )
        shard = payload["shards"][self.shard_key]
        for name, holder in self.sharded.items():
            if name in shard:
                holder.load_state_dict(shard[name])
        for name, holder in self.shared.items():
            holder.load_state_dict(payload[name])
        self._restore_rank_parts(payload, path_name=payload["path"])
