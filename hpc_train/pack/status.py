"""Where a packed sweep's runs stand: the pool's records, with Slurm's word on each allocation.

Slurm's accounting sees an allocation and its job steps, not runs; the allocation's own records
(hpc_train.pack.records) say which run waits, runs or ended how. Slurm adds what the records cannot:

* an allocation that ended for good (cancelled, out of time or of requeues; or its scheduler wrote
  ``finished``) leaves its unfinished runs CANCELLED;
* an allocation back in the queue (requeued) leaves the runs it was running
  INTERRUPTED until it starts them again.

An allocation Slurm does not know yet (just submitted) is taken as live. A packed run's id names the
allocation that was given it; its state is its run's, in whichever allocation has the run now (a rerun's,
once ``--rerun-failed`` packed it again). The report, ``--watch``, the Python API and a waiting login
process read states from here, one Slurm call per reading for all allocations at once.
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional

from hpc_train.jobs import job_states
from hpc_train.pack import records
from hpc_train.pack.records import AllocationPlan, RunState

# Slurm's states of an allocation that is in the queue again after it ran (its steps are gone).
BACK_IN_QUEUE = frozenset({"PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED"})
UNFINISHED = (records.WAITING, records.RUNNING, records.INTERRUPTED)


def merged(run: RunState, allocation_state: Optional[str], allocation_over: bool = False) -> RunState:
    """A run's state from its allocation's records, corrected by Slurm's state of that allocation (None: unknown)
    and by whether the allocation's scheduler said it finished (`allocation_over`)."""
    if run.state not in UNFINISHED:
        return run
    if allocation_over or allocation_state in job_states.ENDED:
        return dataclasses.replace(run, state=records.CANCELLED)
    if run.state == records.RUNNING and allocation_state in BACK_IN_QUEUE:
        return dataclasses.replace(run, state=records.INTERRUPTED)
    return run


def run_seconds(run: RunState, now: Optional[float] = None) -> Optional[float]:
    """How long the run has run (so far, while it runs); None before it started."""
    if run.started is None:
        return None
    end = run.ended if run.ended is not None else (time.time() if now is None else now)
    return max(0.0, end - run.started)


@dataclass(frozen=True)
class PackStatus:
    """One reading of a packed sweep: each run's state (by its number), Slurm's state of each allocation (by its
    job id; missing: Slurm does not know it), each allocation's plan index (by its job id), each run's folder (by
    its number: its run dir, or a Hydra app's run folder, where its step's logs are) and the allocations' plans the
    states were read from (by index)."""

    runs: Dict[str, RunState]
    allocations: Dict[str, str]
    indices: Dict[str, int]
    run_dirs: Dict[str, str] = field(default_factory=dict)
    plans: List[AllocationPlan] = field(default_factory=list)

    def of(self, packed: str) -> Optional[RunState]:
        """The state of the run a packed id names."""
        return self.runs.get(records.split_packed_id(packed)[1])


def read(sweep_dir: Path) -> PackStatus:
    """The sweep's packed runs and allocations now (one Slurm call for all allocations)."""
    plans = records.read_plans(sweep_dir)
    ids = [str(plan.job_id) for plan in plans if plan.job_id]
    slurm = job_states.slurm_states(ids) if ids else {}
    over = {str(plan.job_id) for plan in plans if plan.job_id and records.finished(sweep_dir, plan.index)}
    recorded = records.run_states(sweep_dir, plans=plans)
    # Back in the queue with runs running, says accounting: or it has just started and accounting lags. squeue knows.
    doubt = {
        str(run.job_id)
        for run in recorded.values()
        if run.state == records.RUNNING and slurm.get(str(run.job_id)) in BACK_IN_QUEUE
    }
    if doubt:
        slurm.update(job_states.queue_states(doubt))
    runs = {
        job: merged(state, slurm.get(str(state.job_id)), str(state.job_id) in over) for job, state in recorded.items()
    }
    indices = {str(plan.job_id): plan.index for plan in plans if plan.job_id}
    run_dirs = {run.job: run.run_dir for plan in plans for run in _runs(sweep_dir, plan)}
    return PackStatus(runs, slurm, indices, run_dirs, plans)


def _runs(sweep_dir: Path, plan: AllocationPlan) -> List[records.PackedRun]:
    """The allocation's runs: its plan's, and a fed allocation's runs taken from the feed."""
    return records.runs_of(plan, records.read_events(sweep_dir, plan.index)) if plan.fed else plan.runs


def packed_states(sweep_dir: Path) -> Dict[str, RunState]:
    """Each packed run's state, by its number in the sweep."""
    return read(sweep_dir).runs


def allocation_states(sweep_dir: Path) -> Dict[int, str]:
    """Slurm's state of each allocation, by its index (missing: Slurm does not know it)."""
    found = read(sweep_dir)
    return {index: found.allocations[job_id] for job_id, index in found.indices.items() if job_id in found.allocations}


class SharedPackedStates:
    """A packed sweep's run states, read for all its runs at once and kept for `max_age_s`.

    ``hpc_train.sweep`` hands one to every Job of a packed sweep (as job_states.SharedStates to an unpacked
    one): asking each of 3,000 runs for its state reads the records and asks Slurm once per refresh.
    """

    def __init__(self, sweep_dir: Path, max_age_s: float = 1.0) -> None:
        self.sweep_dir = Path(sweep_dir)
        self.max_age_s = max_age_s
        self._read_at = -math.inf
        self._status = PackStatus({}, {}, {})

    def run(self, packed: str) -> Optional[RunState]:
        if time.monotonic() - self._read_at > self.max_age_s:
            self._status = read(self.sweep_dir)
            self._read_at = time.monotonic()
        return self._status.of(packed)

    def get(self, packed: str) -> Optional[str]:
        """The state of the run `packed` names (None: no allocation lists it)."""
        found = self.run(packed)
        return found.state if found else None
