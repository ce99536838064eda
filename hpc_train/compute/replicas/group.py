"""This process's replica group: its place in the quorum, the gradients averaged over the live groups, recovery.

The group is a job of its own to torch (its ranks, its process group, its strategy). Around each optimizer step:

1. :meth:`ReplicaGroup.begin_step`: torchft's quorum (synchronous). A group behind the others (restarted) receives
   the state of a live group first (weights, optimizer, schedule, position) and reports it, so that the trainer
   re-opens its data at the new position: the steps it missed are skipped, not replayed.
2. The strategy's backward pass reduces the gradients inside the group, as it always does.
3. :meth:`ReplicaGroup.average`: one all-reduce across the groups (rank r of each group with rank r of the others)
   of this rank's gradients, the step's loss and a one-hot of this group, summed; divided by the groups that took
   part. The one-hot says exactly which groups took the step. The same sum carries how many lines of the attempt's
   ``events.jsonl`` (the failures and restarts its launcher saw) each group has read, and which group takes its first
   step since a restart, so that every group records the same events at the same step.
4. :meth:`ReplicaGroup.commit`: every group votes; the optimizer steps only if all of the quorum's collectives
   succeeded. A step that failed (a group died during it) is taken again with the same batch by the survivors.

torchft's own log lines (a failed collective's traceback, its HTTP server's requests) go to the rank's log file only.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from datetime import timedelta
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Set, Tuple

import torch

from hpc_train.compute.replicas.settings import ReplicaSettings
from hpc_train.compute.replicas.state import Holder
from hpc_train.compute.runtime import faults, heartbeat
from hpc_train.compute.runtime.interrupts import REQUEUE, TERMINATE
from hpc_train.compute.runtime.ranks import RankInfo
from hpc_train.compute.runtime.runlog import log_to_file
from hpc_train.records import hang
from hpc_train.records import replicas as rows

log = logging.getLogger("hpc_train")

STOPS = (REQUEUE, TERMINATE)  # the stop requests a step carries across the groups, weakest first
QUORUM_WAIT_S = 3600.0  # how long a step waits for a quorum of min_replicas groups (groups restarting) before failing
QUORUM_NOTE_S = 1.0  # a quorum longer than this is noted in the rank's log
TORCHFT_LOGGERS = ("torchft", "torchft_quorums", "torchft_commits", "torchft_errors")


class StepNotCommitted(Exception):
    """The quorum did not agree on this step (a group failed during it): take it again."""


class ReplicaGroup:
    def __init__(self, settings: ReplicaSettings, ranks: RankInfo, device: torch.device, lighthouse: str) -> None:
        self.settings, self.ranks, self.device, self.lighthouse = settings, ranks, device, lighthouse
        self.group, self.groups = ranks.group, int(settings.replica_groups)
        self.manager: Any = None
        self.members: Set[int] = set(range(self.groups))  # the groups of the last committed step
        self.fewer_steps = 0  # committed steps taken by fewer groups than the job has
        self.drops = self.rejoins = 0  # the groups' drops and rejoins so far
        self.healed = False  # set by the state loader: this step started from a live group's state
        self._step_members: Set[int] = set()
        self.events: List[tuple] = []  # (event, group, step, live) of the last committed step, for the leader
        self._holder: Optional[Holder] = None
        self._store: Optional[torch.distributed.TCPStore] = None  # the group's store, where no process group has one
        # What the launcher saw (hpc_train.records.replicas.append_event): this attempt's events file and its lines
        self.folder: Optional[Path] = None
        self.failures = self.restarts = 0  # the groups' failures and restarts so far, as their launcher saw them
        self.waited_s = 0.0  # how long this group stood waiting for quorums after failures
        self.history: List[Dict[str, Any]] = []  # each failure: group, step, who, cause, restart, rejoined
        self.noted = 0  # the lines of the attempt's events file that are recorded
        self.returning = 0  # this group's restart number until it takes its first step since (0: not restarted)
        self._lines: List[Dict[str, Any]] = []  # the events file's lines as last read
        self._size = -1  # the events file's size when last read
        self._agreed = 0  # the lines every group's rank has read, after this step's sum
        self._returned: Dict[int, int] = {}  # group -> restart number: groups taking their first step since a restart
        self._returns: Dict[Tuple[int, int], int] = {}  # (group, restart) -> the step it rejoined at
        self._lost_from: Optional[float] = None  # when the first quorum of the step being taken began
        self._quorum_end = 0.0
        self._retried = False  # the step being taken failed at least once
        self.last_wait = 0.0  # how long the last committed step waited for its quorum (0 unless it is counted)

    # -- set-up ---------------------------------------------------------------------------
    def connect(self, state: Holder, step: int) -> None:
        """Join the lighthouse with the trainer's state (what a restarting group receives) at optimizer step `step`.
        Called once the group is ready to train: a group heartbeats from here on, and the others wait for it."""
        os.environ.setdefault("RUST_LOG", "warn")  # torchft's quorum logs a line per step at its default, info
        from torchft import Manager, ProcessGroupGloo, ProcessGroupNCCL  # ~2 s: only runs with replica groups

        self._holder = state
        _quiet_torchft()
        timeout = timedelta(seconds=float(self.settings.timeout_s))
        if not self.ranks.is_distributed:  # a group of one rank has no process group, hence no store to share
            self._store = torch.distributed.TCPStore(
                self.ranks.master_addr, int(self.ranks.master_port), 1, is_master=True, timeout=timeout
            )
        pg = ProcessGroupNCCL(timeout=timeout) if self.device.type == "cuda" else ProcessGroupGloo(timeout=timeout)
        self.manager = Manager(
            pg=pg,
            load_state_dict=self._load,
            state_dict=self._save,
            min_replica_size=int(self.settings.min_replicas),
            use_async_quorum=False,  # a restarted group is healed before its first forward pass
            timeout=timeout,
            quorum_timeout=timedelta(seconds=QUORUM_WAIT_S),
            connect_timeout=timeout,
            rank=self.ranks.rank,
            world_size=self.ranks.world_size,
            store_addr=self.ranks.master_addr,
            store_port=int(self.ranks.master_port),
            lighthouse_addr=self.lighthouse,
            replica_id=f"group_{self.group:05d}",  # sorted by the lighthouse: group 0 has replica rank 0
            hostname=socket.getfqdn(),
            init_sync=False,  # every group starts from the same seeded weights or the same checkpoint
        )
        self.manager.load_state_dict({"step": step, "batches_committed": step})

    def counts(self) -> Dict[str, Any]:
        """What the groups' history adds up to (checkpointed, and handed to a restarting group)."""
        members = sorted(self.members)
        folder = self.folder.name if self.folder is not None else ""
        return {
            "members": members,
            "fewer": self.fewer_steps,
            "drops": self.drops,
            "rejoins": self.rejoins,
            "failures": self.failures,
            "restarts": self.restarts,
            "waited_s": self.waited_s,
            "history": [dict(entry) for entry in self.history],
            "noted": [folder, self.noted],  # lines of this attempt's events file: another attempt starts from 0
        }

    def load_counts(self, value: Dict[str, Any]) -> None:
        self.fewer_steps, self.drops, self.rejoins = (int(value.get(k, 0)) for k in ("fewer", "drops", "rejoins"))
        self.failures, self.restarts = (int(value.get(k, 0)) for k in ("failures", "restarts"))
        self.waited_s = float(value.get("waited_s", 0.0))
        self.history = [dict(entry) for entry in value.get("history", [])]
        folder, noted = value.get("noted") or ["", 0]
        self.noted = int(noted) if self.folder is not None and folder == self.folder.name else 0
        if "members" in value:
            self.members = set(value["members"])

    def _save(self) -> Dict[str, Any]:
        assert self._holder is not None
        return {"trainer": self._holder.state_dict(), **self.counts()}

    def _load(self, incoming: Dict[str, Any]) -> None:
        assert self._holder is not None
        self._holder.load_state_dict(incoming["trainer"])
        self.load_counts(incoming)
        self.healed = True

    # -- each step ------------------------------------------------------------------------
    def begin_step(self) -> bool:
        """The quorum of this step; True when this group just received a live group's state (it was behind)."""
        self.healed = False
        started = time.monotonic()
        if self._lost_from is None:
            self._lost_from = started
        heartbeat.mark(hang.QUORUM, self.manager.current_step() + 1)
        self.manager.start_quorum()
        self._quorum_end = time.monotonic()
        waited = self._quorum_end - started
        if waited > QUORUM_NOTE_S:
            step = self.manager.current_step() + 1
            log_to_file(f"replica group {self.group}: the quorum of step {step} took {waited:.1f} s", logging.INFO)
        if self.healed:
            log.info(
                "replica group %d: took the state of a live group at step %d", self.group, self.manager.current_step()
            )
        return self.healed

    def error_words(self) -> str:
        """torchft's error of the step that failed, in one line (its traceback is in this rank's log)."""
        error = self.manager.errored() if self.manager is not None else None
        cause = getattr(error, "original_exception", error)
        if cause is None:
            return "another group voted against it"
        first = (str(cause).strip().splitlines() or [""])[0]
        return f"{type(cause).__name__}: {first[:200]}"

    def retry(self) -> None:
        """The step failed (StepNotCommitted): it is taken again, and the time since its first quorum counts."""
        self._retried = True

    def average(self, grads: Sequence[torch.Tensor], loss: torch.Tensor, stop: int = 0) -> Tuple[torch.Tensor, int]:
        """Sum `grads` (this rank's local gradients, reduced inside the group) and `loss` over the quorum's groups and
        divide by their number, in place; returns the loss averaged over the live groups, and the strongest stop
        request (hpc_train.compute.runtime.interrupts: 0, 1 or 2) of this rank's peers in every live group, so that
        every group stops after the same step."""
        manager = self.manager
        faults.maybe_kill(self.ranks.global_rank, f"{manager.current_step()}.average")  # HPC_TRAIN_KILL_AT=R:S.average
        groups, lines = self.groups, 1 + self.groups + len(STOPS)  # where the events' slots begin
        meta = torch.zeros(lines + 2 * groups, dtype=torch.float64, device=self.device)
        meta[0] = loss.detach().to(torch.float64)
        meta[1 + self.group] = 1.0
        if stop:
            meta[groups + stop] = 1.0  # one slot per request: after the sum, the strongest one that is there
        meta[lines + self.group] = float(len(self._read_events()))  # the lines of events.jsonl this rank has read
        meta[lines + groups + self.group] = float(self.returning)  # its restart number, on its first step since
        works = [manager.allreduce(meta, reduce_op=_sum())]
        flat = torch.cat([g.reshape(-1) for g in grads]) if grads else None
        if flat is not None:
            works.append(manager.allreduce(flat, reduce_op=_sum()))
        for work in works:
            work.wait()
        self._step_members = {g for g in range(self.groups) if meta[1 + g].item() > 0.5}
        self._agreed = int(max(meta[lines + g].item() for g in self._step_members) if self._step_members else 0)
        self._returned = {g: int(meta[lines + groups + g].item()) for g in range(groups)}
        self._returned = {g: restart for g, restart in self._returned.items() if restart > 0}
        count = max(1, len(self._step_members))
        if flat is not None:
            flat.div_(count)
            offset = 0
            for g in grads:
                g.copy_(flat[offset : offset + g.numel()].view_as(g))
                offset += g.numel()
        requested = [code for code in STOPS if meta[self.groups + code].item() > 0.5]
        return (meta[0] / count).to(loss.dtype), max(requested, default=0)

    def commit(self) -> None:
        """Every group's vote on this step; raises StepNotCommitted when it must be taken again."""
        if not self.manager.should_commit():
            raise StepNotCommitted()
        step = self.manager.current_step()  # torchft counts the committed step: this is its number
        live = len(self._step_members)
        changed = rows.changes(self.members, self._step_members)
        back = {group for event, group in changed if event == rows.REJOINED}
        changed += [(rows.REJOINED, group) for group in sorted(set(self._returned) - back)]
        launcher = self._launcher_events(step)
        self._count_wait(bool(changed or launcher))
        self.events = [(event, group, step, live, words) for event, group, words in launcher]
        self.events += [(event, group, step, live, {}) for event, group in changed]
        self.events.sort(key=lambda event: rows.ORDER.index(event[0]))
        self.members = set(self._step_members)
        self.drops += sum(1 for event, *_ in self.events if event == rows.DROPPED)
        self.rejoins += sum(1 for event, *_ in self.events if event == rows.REJOINED)
        for event, group, *_ in self.events:
            if event == rows.REJOINED and group in self._returned:
                self._returns[(group, self._returned[group])] = step
        self._mark_returns()
        self.returning = 0
        if live < self.groups:
            self.fewer_steps += 1

    # -- what the launcher saw ----------------------------------------------------------------------------
    def _read_events(self) -> List[Dict[str, Any]]:
        """The attempt's events file as it is now (read again only when it grew)."""
        if self.folder is None:
            return self._lines
        try:
            size = (self.folder / rows.EVENTS).stat().st_size
        except OSError:
            return self._lines
        if size != self._size:
            self._lines, self._size = rows.read_events(self.folder), size
        return self._lines

    def _launcher_events(self, step: int) -> List[Tuple[str, int, Dict[str, Any]]]:
        """(event, group, words) of the launcher's lines that every group has read by this step and that are not
        recorded yet; their counts and the failures' history updated."""
        found = []
        for line in self._lines[self.noted : self._agreed]:
            event, group = line.get("event"), int(line.get("group", -1))
            if event == rows.FAILED:
                self.failures += 1
                words = {key: line.get(key) for key in ("who", "cause")}
                restart = int(line.get("restart", 0)) + 1  # the restart that follows this failure
                self.history.append({"group": group, "step": step, **words, "restart": restart, "rejoined": None})
                found.append((event, group, words))
            elif event == rows.RESTARTED:
                self.restarts += 1
                found.append((event, group, {"restart": line.get("restart")}))
        self.noted = max(self.noted, min(self._agreed, len(self._lines)))
        return found

    def _mark_returns(self) -> None:
        for entry in self.history:
            if entry.get("rejoined") is None:
                entry["rejoined"] = self._returns.get((int(entry["group"]), int(entry.get("restart", 0))))

    def _count_wait(self, disrupted: bool) -> None:
        """The committed step's wait for its quorum counts when the step failed first or something happened to the
        groups (not for the group that returns: it did not wait, it was away)."""
        lost = self._quorum_end - self._lost_from if self._lost_from is not None else 0.0
        counted = (self._retried or disrupted) and not self.returning
        self.last_wait = lost if counted else 0.0
        self.waited_s += self.last_wait
        self._lost_from, self._retried = None, False

    @property
    def alone(self) -> bool:
        """This step's quorum holds this group only."""
        return self.manager.num_participants() <= 1

    @property
    def leads(self) -> bool:
        """This group writes the run's rows and checkpoints: the lowest-numbered group of the last step."""
        return bool(self.members) and min(self.members) == self.group

    def close(self) -> None:
        if self.manager is not None:
            self.manager.shutdown(wait=False)
            self.manager = None


def _quiet_torchft() -> None:
    """torchft's loggers and its HTTP server's request lines into this rank's log file, not the console: a failed
    collective's traceback is kept there, and the console says what happened in one line."""
    files = [handler for handler in logging.getLogger("hpc_train").handlers if isinstance(handler, logging.FileHandler)]
    for name in TORCHFT_LOGGERS:
        logger = logging.getLogger(name)
        logger.handlers[:] = files
        logger.propagate = False
        logger.setLevel(logging.WARNING)

    def to_log(handler: Any, format: str, *args: Any) -> None:
        logging.getLogger("torchft.http").debug(format, *args)

    BaseHTTPRequestHandler.log_message = to_log  # type: ignore[method-assign]  # torchft's checkpoint server's lines


def _sum() -> Any:
    from torch.distributed import ReduceOp  # torch.distributed is imported by the time a step sums

    return ReduceOp.SUM
