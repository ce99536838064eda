"""The supervisor of a run's replica groups (``fault_tolerance.replica_groups``), whatever runs their processes: the
restart policy, the late groups' grace and the launcher's records, written once for both launchers.

It starts every group, then looks at them until the run ends. A group that ended without finishing training is on
record as failed (the attempt's ``events.jsonl``, which the leading group's rank 0 turns into rows: see
hpc_train.records.replicas) and is started again, on record as restarted before its processes start, once there is
room for it, at most ``max_restarts`` times a group; one more failure ends the run with the group's exit status. An
exit that ends the whole run (a refusal, a stop signal's) ends it at once. Once one group has finished, the others
get ``timeout_s`` plus a minute to finish too (a late one may be rejoining); a group that fails meanwhile is not
started again.

What runs a group is a small adapter (:class:`GroupProcesses`): local processes (the local launcher,
hpc_train.launch.backends.local.groups) or an srun job step on the job's nodes (the batch host's agent,
hpc_train.batchhost.groups). The adapter starts a group, says whether it ended, how and whether that was its
finish, finds room for a restart and puts a failure in words; the supervisor decides.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Callable, List, NamedTuple, Optional, Protocol, Set

from hpc_train.contracts.replica_plan import ReplicaPlan
from hpc_train.records import replicas as marks
from hpc_train.records.rundir import EXIT_INTERRUPTED, EXIT_REFUSED

ENDING = (EXIT_REFUSED, EXIT_INTERRUPTED)  # a group's exit that ends the whole run; a hung group is restarted
LATE_GRACE_S = 60.0  # beyond timeout_s, what the groups still running get once one group has finished


class Failure(NamedTuple):
    """A group's failure in the adapter's words."""

    said: str  # the console's words after "replica group G", e.g. ": rank 1 was killed by SIGKILL"
    who: Optional[str]  # the failure row's `who` (the rank, the nodes; None: not known)
    cause: str  # the failure row's `cause`
    where: str = ""  # where the restart will be, after "restarting group G" (" on free nodes")
    after: str = ""  # the console's words after the restart count (". Its log: ...")


class GroupProcesses(Protocol):
    """What runs the groups' processes, as the supervisor sees it."""

    poll_s: float  # between two looks at the groups
    room_wait_s: float  # between two looks for room to restart a group in

    def start(self, group: int, restart: int, nodes: Optional[List[str]]) -> None:
        """Start group `group` (its `restart`-th restart; 0: its first start) on `nodes` (None: the group's own place
        in the job; []: anywhere, as room() gave)."""

    def ended(self, group: int) -> Optional[int]:
        """The exit status of the group's start that ended (a rank's failure ends it); None while it runs."""

    def finished(self, group: int, code: int) -> bool:
        """The group's end with `code` was its finish (it trained to the end), not a failure."""

    def failure(self, group: int, code: int) -> Failure:
        """The group's start that ended with `code` in words, what is left of it stopped."""

    def room(self) -> Optional[List[str]]:
        """The nodes for a group's restart ([]: anywhere); None: no room yet."""

    def stop_group(self, group: int) -> None:
        """Stop what is left of a group that will not be started again."""

    def ending(self, code: int) -> None:
        """The run ends with a group's exit `code` (ENDING): what the processes need before they are stopped."""


class Clock(NamedTuple):
    now: Callable[[], float] = time.monotonic
    sleep: Callable[[float], None] = time.sleep
    wall: Callable[[], float] = time.time  # the records' seconds since the epoch


SYSTEM_CLOCK = Clock()


def say(text: str) -> None:
    print(f"hpc-train: {text}", file=sys.stderr, flush=True)


class ReplicaSupervisor:
    def __init__(self, plan: ReplicaPlan, processes: GroupProcesses, folder: Path, clock: Clock = SYSTEM_CLOCK) -> None:
        """`folder`: the attempt's (hpc_train.records.replicas.attempt_folder), where the records go."""
        self.plan, self.processes, self.folder, self.clock = plan, processes, Path(folder), clock
        self.restarts = {group: 0 for group in range(plan.groups)}  # restarts so far, a group
        self.done: Set[int] = set()  # groups that finished, or that will not be started again
        self.waiting: List[int] = []  # failed groups, to restart once there is room
        self.finished_at: Optional[float] = None  # when the first group finished

    def run(self) -> int:
        """Every group started and supervised to the run's end; the run's exit status."""
        for group in range(self.plan.groups):
            self.processes.start(group, 0, None)
        while True:
            code = self._look()
            if code is not None:
                return code
            self._restart_waiting()
            if len(self.done) == self.plan.groups or self._late():
                return 0
            self.clock.sleep(self.processes.room_wait_s if self.waiting else self.processes.poll_s)

    def _look(self) -> Optional[int]:
        """Each group that ended since the last look, decided; the run's exit status when that ends it."""
        for group in range(self.plan.groups):
            if group in self.done or group in self.waiting:
                continue
            code = self.processes.ended(group)
            if code is None:
                continue
            if self.processes.finished(group, code):
                self.done.add(group)
                self.finished_at = self.clock.now() if self.finished_at is None else self.finished_at
            elif self.finished_at is not None:  # the run is complete: a late group is not started again
                self.processes.stop_group(group)
                self.done.add(group)
                say(f"replica group {group} ended after another group had finished; not restarted")
            elif code in ENDING:
                self.processes.ending(code)
                return code
            elif self.restarts[group] >= self.plan.max_restarts:
                say(
                    f"replica group {group} failed {self.restarts[group] + 1} times"
                    f" (fault_tolerance.max_restarts={self.plan.max_restarts}); stopping the run."
                )
                return code if code > 0 else 1
            else:
                self._failed(group, code)
        return None

    def _failed(self, group: int, code: int) -> None:
        """Group `group` ended with `code` before it finished: on the console and on record, to be restarted."""
        failure = self.processes.failure(group, code)
        restart = self.restarts[group]
        marks.append_event(
            self.folder, marks.FAILED, group, self.clock.wall(), who=failure.who, cause=failure.cause, restart=restart
        )
        say(
            f"replica group {group}{failure.said}; the other groups train on; restarting group {group}{failure.where}"
            f" ({restart + 1} of at most {self.plan.max_restarts}){failure.after}"
        )
        self.waiting.append(group)

    def _restart_waiting(self) -> None:
        """The failed groups started again, in the order they failed, while there is room. On record before the
        group's processes start: whoever meets the restarted group (its own ranks, the live groups in the quorum it
        joins) finds its restart in the file, and its rows come failed, restarted, rejoined."""
        for group in list(self.waiting):
            nodes = self.processes.room()
            if nodes is None:
                return
            self.waiting.remove(group)
            self.restarts[group] += 1
            where = {"where": ",".join(nodes)} if nodes else {}
            restart = self.restarts[group]
            marks.append_event(self.folder, marks.RESTARTED, group, self.clock.wall(), restart=restart, **where)
            self.processes.start(group, restart, nodes)

    def _late(self) -> bool:
        """The groups still running had their grace since the first group finished (the run is complete)."""
        limit = self.plan.timeout_s + LATE_GRACE_S
        if self.finished_at is None or self.clock.now() - self.finished_at <= limit:
            return False
        late = sorted(set(range(self.plan.groups)) - self.done)
        words = f"replica group(s) {late} did not finish {limit:.0f} s after the first"
        say(f"{words}; stopping them (the run is complete).")
        return True
