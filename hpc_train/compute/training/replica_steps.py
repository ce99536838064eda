"""The trainer's side of replica groups (``fault_tolerance.replica_groups``, hpc_train.compute.replicas).

What the loop does differently in a group: each step opens with the quorum (a group that was behind takes a live
group's state and re-opens its data there), the gradients and the loss are averaged over the live groups after the
group's own reduction, the optimizer steps only when every group agreed (a step that failed is taken again), and
the run's rows and checkpoints are written by the lowest-numbered live group alone.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import Any, Dict, Optional, Tuple

import torch

from hpc_train.compute.replicas.group import ReplicaGroup, StepNotCommitted
from hpc_train.compute.replicas.state import (
    Holder,
    load_model_state,
    load_optimizer_state,
    local_tree,
    model_state,
    optimizer_state,
)
from hpc_train.compute.runtime import distributed, faults, heartbeat
from hpc_train.compute.runtime.refusal import Refusal
from hpc_train.compute.runtime.runlog import log_to_file
from hpc_train.compute.training.reproducible import parameter_digest
from hpc_train.errors import JobFailed
from hpc_train.processes.rank_env import REPLICA_RESTART_VARIABLE
from hpc_train.records import hang, rundir
from hpc_train.records import replicas as rows

log = logging.getLogger("hpc_train")

DIGESTS_VARIABLE = "HPC_TRAIN_REPLICA_DIGESTS"  # "1": every group's rank 0 logs its parameters' digest at each step
HOLD_NOTE_S = 0.5  # a hold (HPC_TRAIN_HOLD_AT) longer than this is noted in the rank's log
# HPC_TRAIN_HOLD_AT: once a restarted group's ranks have all asked for their quorum, the time its request is given to
# reach the lighthouse before the held groups ask for theirs (else the lighthouse may form their quorum without it).
# Measured: it took a live group's state 20-40 ms after its last rank asked; released at once, one run in 8 missed it.
HOLD_SETTLE_S = 0.5
START_WAIT_S = 3600.0  # how long the groups of a starting attempt wait for each other before the first step


def restart_number() -> int:
    """How many times the launcher restarted this group inside the attempt (0: its first start)."""
    return int(os.environ.get(REPLICA_RESTART_VARIABLE, "0") or 0)


def restarted() -> bool:
    """This group was restarted by its launcher inside the attempt (it rejoins from a live group, not from disk)."""
    return restart_number() > 0


class ReplicaLoop:
    """The training loop's side of this rank's replica group: each step's quorum, the average across the live groups
    and its commit, the state a restarting group takes, the rows while the group leads (the module's words)."""

    def __init__(self, trainer: Any, group: ReplicaGroup) -> None:
        """`trainer`: the Trainer (hpc_train.compute.training.trainer) whose loop this serves; not imported here, the
        trainer imports this module."""
        self.trainer, self.group = trainer, group
        self.restarted = restarted()
        self.digests = os.environ.get(DIGESTS_VARIABLE) == "1"
        self._quorum_open = False  # this group took a live group's state in the quorum of the step it takes next
        self._orphan = self.restarted  # restarted and not yet healed: it must find a live group in its first quorum
        self._asked: Dict[Tuple[int, int], float] = {}  # (group, restart) -> when all its ranks were seen asking

    # -- the state a restarting group receives ---------------------------------------------------------
    def holder(self) -> Holder:
        return Holder(self._state, self._load)

    def _state(self) -> Dict[str, Any]:
        t = self.trainer
        state: Dict[str, Any] = {
            "model": model_state(t.strategy.unwrap(t.wrapped)),
            "optimizer": optimizer_state(t.optimizer),
            "scheduler": t.scheduler.state_dict(),
            "state": dict(t.state.state_dict()),
        }
        if t.scaler is not None:
            state["scaler"] = t.scaler.state_dict()
        if t.ema is not None:
            state["ema"] = local_tree(t.ema.state_dict())
        return state

    def _load(self, incoming: Dict[str, Any]) -> None:
        t = self.trainer
        load_model_state(t.strategy.unwrap(t.wrapped), incoming["model"])
        load_optimizer_state(t.optimizer, incoming["optimizer"])
        t.scheduler.load_state_dict(incoming["scheduler"])
        t.state.load_state_dict(incoming["state"])
        if t.scaler is not None and "scaler" in incoming:
            t.scaler.load_state_dict(incoming["scaler"])
        if t.ema is not None and "ema" in incoming:
            t.ema.load_state_dict(incoming["ema"])

    def checkpointed(self) -> Holder:
        """What checkpoints carry of the groups: who took the last step and how many steps ran with fewer groups."""

        def save() -> Dict[str, Any]:
            return self.group.counts()

        def load(value: Dict[str, Any]) -> None:
            self.group.load_counts(value)

        return Holder(save, load)

    # -- the attempt's start ------------------------------------------------------------------------
    def connect(self) -> None:
        """Join the lighthouse at the restored step. In an attempt's start every group waits until all of them are
        ready, so that the first quorum holds them all; a restarted group joins the others at once."""
        t = self.trainer
        faults.maybe_kill(t.ranks.global_rank, "start")  # HPC_TRAIN_KILL_AT=RANK:start: a failure in start-up
        if self.restarted:
            faults.restart_sleep()  # HPC_TRAIN_RESTART_SLEEP: a slow start-up, injected
        folder = rows.attempt_folder(t.run_dir, os.environ)
        self.group.folder = folder  # where the launcher records the groups' failures and restarts
        self.group.returning = restart_number()
        self.group.connect(self.holder(), t.state.global_step)
        if t.ranks.is_main:  # a restarted group too: one that failed before the first step is what the others await
            folder.mkdir(parents=True, exist_ok=True)
            rows.ready_file(folder, self.group.group).touch()
        if self.restarted:
            log.info("replica group %d: restarted, rejoining the live groups", self.group.group)
            return
        if t.ranks.is_main:
            self._wait_for_groups(folder)
        distributed.barrier()

    def _wait_for_groups(self, folder: Path) -> None:
        deadline = time.monotonic() + START_WAIT_S
        while not all(rows.ready_file(folder, g).exists() for g in range(self.group.groups)):
            if time.monotonic() > deadline:
                raise JobFailed(f"the replica groups did not all start within {START_WAIT_S:.0f} s ({folder})")
            time.sleep(0.05)

    def finished(self) -> None:
        """Training ended in this group: its launcher must not restart it."""
        if self.trainer.ranks.is_main:
            folder = rows.attempt_folder(self.trainer.run_dir, os.environ)
            folder.mkdir(parents=True, exist_ok=True)
            rows.finished_file(folder, self.group.group).touch()

    # -- each step ----------------------------------------------------------------------------------
    def take_step(self, batch: Any, logged: bool) -> Optional[Tuple[Any, Any, Any]]:
        """train_step over `batch` once every group agreed on it; None when this group took a live group's state
        instead (the caller re-opens its data at the new position)."""
        t = self.trainer
        while True:
            if self._quorum_open:  # healed in this step's quorum: the step itself is still to take, with the others
                self._quorum_open = False
            else:
                self._hold()  # HPC_TRAIN_HOLD_AT only
                if self.group.begin_step():
                    t.epochs.resume_at(t.state.epoch, t.state.step_in_epoch, False)
                    self._quorum_open = True
                    self._orphan = False
                    return None
                if self._orphan and self.group.alone:
                    raise Refusal(
                        f"replica group {self.group.group} restarted, but no live group is left to take the training"
                        " state from (the others finished or failed): the run cannot go on from memory. Fix:"
                        f" {rundir.resume_hint(t.run_dir)}."
                    )
            self._orphan = False
            try:
                result = t.train_step(batch, logged)
            except StepNotCommitted:
                t.optimizer.zero_grad(set_to_none=True)
                self.group.retry()
                log_to_file(  # the console has the launcher's line on the group that failed; the traceback is above
                    f"replica group {self.group.group}: step {t.state.global_step + 1} did not complete in every"
                    f" group ({self.group.error_words()}); taking it again with the groups left",
                    logging.WARNING,
                )
                continue
            self._after_commit()
            return result

    # -- HPC_TRAIN_HOLD_AT: the live groups wait for a restarted one (a test facility) ---------------------
    def _hold(self) -> None:
        """A restarted group's rank says, before its first quorum, that it asks for one; from the step the variable
        names on, the others wait for it before their quorum (whose lighthouse then takes it in: it is a
        participant already)."""
        if not faults.hold_from():
            return
        t, group = self.trainer, self.group
        folder = rows.attempt_folder(t.run_dir, os.environ)
        if self._orphan:
            rows.asking_file(folder, group.group, t.ranks.rank).write_text(str(restart_number()))
            return
        step = t.state.global_step + 1
        heartbeat.mark(hang.QUORUM, step)  # waiting for another group, as in a quorum: not hung
        waited = faults.hold(step, lambda: self._all_back(folder))
        if waited > HOLD_NOTE_S:
            said = f"replica group {group.group}: held {waited:.1f} s before step {step} ({faults.HOLD_VARIABLE})"
            log_to_file(said, logging.INFO)

    def _all_back(self, folder: Path) -> bool:
        """A group was restarted, and every rank of each group missing from the last step asks for the quorum since
        its group's last restart (for HOLD_SETTLE_S at least, as this rank saw it)."""
        restarts = {
            int(line.get("group", -1)): int(line.get("restart", 0))
            for line in rows.read_events(folder)
            if line.get("event") == rows.RESTARTED
        }
        if not restarts:
            return False
        now = time.monotonic()
        for g in set(range(self.group.groups)) - set(self.group.members):
            need = restarts.get(g, 1)  # away and not restarted yet: back from its first restart
            if any(_number(rows.asking_file(folder, g, r)) < need for r in range(self.trainer.ranks.world_size)):
                return False
            if now - self._asked.setdefault((g, need), now) < HOLD_SETTLE_S:
                return False
        return True

    def average_and_commit(self, loss: torch.Tensor) -> torch.Tensor:
        """Inside the step, after the group's own backward pass: gradients and loss over the live groups; raises
        StepNotCommitted unless every group agreed."""
        model = self.trainer.model
        grads = []
        for param in model.parameters():
            if not param.requires_grad:
                continue
            if param.grad is None:
                param.grad = torch.zeros_like(param)
            grad = param.grad
            grads.append(grad.to_local() if hasattr(grad, "to_local") and hasattr(grad, "placements") else grad)
        flag = self.trainer.stop_flag
        loss, stop = self.group.average(grads, loss, flag.request if flag is not None else 0)
        self.group.commit()
        if flag is not None and stop > flag.request:  # another group got the stop signal: all stop after this step
            flag.request = stop
        return loss

    def _after_commit(self) -> None:
        t, group = self.trainer, self.group
        t.metrics.enabled = t.is_main
        step = t.state.global_step + 1  # the step just committed (the loop counts it next)
        for event, member, _, live, words in group.events:
            line = rows.event_log_line(event, member, step, live, group.groups, **words)
            if event in (rows.FAILED, rows.RESTARTED):  # the launcher said so on the console already
                log_to_file(line, logging.WARNING)
            else:
                log.warning("%s", line) if event == rows.DROPPED else log.info("%s", line)
            if t.is_main:
                waited = round(group.last_wait, 3) if event == rows.FAILED else None
                t.metrics.write(rows.event_row(event, member, step, time.time(), live, waited_s=waited, **words))
        if self.digests and t.ranks.is_main:
            log.info(
                "replica group %d step %d parameter digest %s",
                group.group,
                step,
                parameter_digest(model_state(t.strategy.unwrap(t.wrapped))),
            )

    @property
    def live(self) -> int:
        """How many groups took the last step."""
        return max(1, len(self.group.members))

    @property
    def leads(self) -> bool:
        return self.group.leads

    def summary_fields(self) -> Dict[str, Any]:
        return {
            rows.GROUPS: self.group.groups,
            rows.FEWER_STEPS: self.group.fewer_steps,
            rows.DROPS: self.group.drops,
            rows.REJOINS: self.group.rejoins,
            rows.FAILURES: self.group.failures,
            rows.RESTARTS: self.group.restarts,
            rows.WAITED: round(self.group.waited_s, 3),
            rows.HISTORY: [
                {key: entry.get(key) for key in ("group", "step", "who", "cause", "rejoined")}
                for entry in self.group.history
            ],
        }


def _number(path: Path) -> int:
    """The number a small file holds (0: none yet)."""
    try:
        return int(path.read_text().strip() or 0)
    except (OSError, ValueError):
        return 0
