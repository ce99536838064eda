"""This process's replica group: its place in the quorum, the gradients averaged over the live groups, recovery.

The group is a job of its own to torch (its ranks, its process group, its strategy). Around each optimizer step:

1. :meth:`ReplicaGroup.begin_step`: torchft's quorum (synchronous). A group behind the others (restarted) receives
   the state of a live group first (weights, optimizer, schedule, position) and reports it, so that the trainer
   re-opens its data at the new position: the steps it missed are skipped, not replayed.
2. The strategy's backward pass reduces the gradients inside the group, as it always does.
3. :meth:`ReplicaGroup.average`: one all-reduce across the groups (rank r of each group with rank r of the others)
   of this rank's gradients, the step's loss and a one-hot of this group, summed; divided by the groups that took
   part. The one-hot says exactly which groups took the step.
4. :meth:`ReplicaGroup.commit`: every group votes; the optimizer steps only if all of the quorum's collectives
   succeeded. A step that failed (a group died during it) is taken again with the same batch by the survivors.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from datetime import timedelta
from typing import Any, Dict, List, Optional, Sequence, Set, Tuple

import torch

from hpc_train.compute.replicas.settings import ReplicaSettings
from hpc_train.compute.replicas.state import Holder
from hpc_train.compute.runtime import heartbeat
from hpc_train.compute.runtime.interrupts import REQUEUE, TERMINATE
from hpc_train.compute.runtime.ranks import RankInfo
from hpc_train.records import hang
from hpc_train.records import replicas as rows

log = logging.getLogger("hpc_train")

STOPS = (REQUEUE, TERMINATE)  # the stop requests a step carries across the groups, weakest first
QUORUM_WAIT_S = 3600.0  # how long a step waits for a quorum of min_replicas groups (groups restarting) before failing


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

    # -- set-up ---------------------------------------------------------------------------
    def connect(self, state: Holder, step: int) -> None:
        """Join the lighthouse with the trainer's state (what a restarting group receives) at optimizer step `step`.
        Called once the group is ready to train: a group heartbeats from here on, and the others wait for it."""
        os.environ.setdefault("RUST_LOG", "warn")  # torchft's quorum logs a line per step at its default, info
        from torchft import Manager, ProcessGroupGloo, ProcessGroupNCCL  # ~2 s: only runs with replica groups

        self._holder = state
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
        return {"members": members, "fewer": self.fewer_steps, "drops": self.drops, "rejoins": self.rejoins}

    def load_counts(self, value: Dict[str, Any]) -> None:
        self.fewer_steps, self.drops, self.rejoins = (int(value.get(k, 0)) for k in ("fewer", "drops", "rejoins"))
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
        heartbeat.mark(hang.QUORUM, self.manager.current_step() + 1)
        self.manager.start_quorum()
        waited = time.monotonic() - started
        if waited > 1.0:
            log.info(
                "replica group %d: the quorum of step %d took %.1f s",
                self.group,
                self.manager.current_step() + 1,
                waited,
            )
        if self.healed:
            log.info(
                "replica group %d: took the state of a live group at step %d", self.group, self.manager.current_step()
            )
        return self.healed

    def average(self, grads: Sequence[torch.Tensor], loss: torch.Tensor, stop: int = 0) -> Tuple[torch.Tensor, int]:
        """Sum `grads` (this rank's local gradients, reduced inside the group) and `loss` over the quorum's groups and
        divide by their number, in place; returns the loss averaged over the live groups, and the strongest stop
        request (hpc_train.compute.runtime.interrupts: 0, 1 or 2) of this rank's peers in every live group, so that
        every group stops after the same step."""
        manager = self.manager
        meta = torch.zeros(1 + self.groups + len(STOPS), dtype=torch.float64, device=self.device)
        meta[0] = loss.detach().to(torch.float64)
        meta[1 + self.group] = 1.0
        if stop:
            meta[self.groups + stop] = 1.0  # one slot per request: after the sum, the strongest one that is there
        works = [manager.allreduce(meta, reduce_op=_sum())]
        flat = torch.cat([g.reshape(-1) for g in grads]) if grads else None
        if flat is not None:
            works.append(manager.allreduce(flat, reduce_op=_sum()))
        for work in works:
            work.wait()
        self._step_members = {g for g in range(self.groups) if meta[1 + g].item() > 0.5}
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
        self.events = [(event, group, step, live) for event, group in rows.changes(self.members, self._step_members)]
        self.members = set(self._step_members)
        self.drops += sum(1 for event, *_ in self.events if event == rows.DROPPED)
        self.rejoins += sum(1 for event, *_ in self.events if event == rows.REJOINED)
        if live < self.groups:
            self.fewer_steps += 1

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


def _sum() -> Any:
    from torch.distributed import ReduceOp  # torch.distributed is imported by the time a step sums

    return ReduceOp.SUM
