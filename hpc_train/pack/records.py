"""A packed sweep's records: which runs each allocation takes (its plan), and what its scheduler did with them.

Written in ``<sweep dir>/.hpc_train/pack/``:

* ``allocation_<k>.json`` (the login node, at submission): the allocation's shape, its sbatch parameters and its
  runs, each with its layout and the command its job step runs; ``job_id`` is filled in once sbatch answered;
* ``allocation_<k>.events.jsonl`` (the allocation's scheduler, on its batch host, append-only): one line per
  event of a run (``claimed``: a fed allocation took it from the feed, hpc_train.pack.feed, its PackedRun with it;
  ``started``, ``ended``: a failed step's ``said`` and ``srun_log`` when srun itself wrote an
  error, such as Slurm's refusal of the step) or of the allocation (``began``, ``signal``, ``requeued``, ``finished``;
  ``terminated`` when Slurm's SIGTERM ended it: Slurm's state of the job then says whether it comes back).

Only the scheduler of allocation k writes its events file, so no two writers share a file. The report, ``--watch``,
the Python API and a waiting sweeper read a run's state from here (Slurm's accounting sees steps, not runs). A
packed run's id, in ``jobs.tsv`` and the API, is ``<allocation's job id>:<run>``. No torch here.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Dict, List, Optional, Protocol

from hpc_train.records import rundir
from hpc_train.records.rundir import SLURM_LOGS

PACKED_ENV = "HPC_TRAIN_PACKED_RUN"  # set on a packed run's job step: the allocation, not the run, requeues
FOLDER = Path(".hpc_train") / "pack"

# A run's states, as the report shows them (Slurm's words where Slurm has one).
WAITING = "WAITING"  # in its allocation's list, not started (the allocation pending, or its GPUs busy)
RUNNING = "RUNNING"
COMPLETED = "COMPLETED"
FAILED = "FAILED"
INTERRUPTED = "INTERRUPTED"  # checkpointed on the allocation's signal: resumes when the allocation restarts
CANCELLED = "CANCELLED"  # its allocation ended (cancelled, out of time, out of requeues) before it finished
ENDED_STATES = (COMPLETED, FAILED, CANCELLED)
CLAIMED = "claimed"  # the event of a run a fed allocation took from the feed (hpc_train.pack.feed), with its entry


@dataclass(frozen=True)
class PackedRun:
    """One run of a packed sweep: its folder, its layout (as its own job would have it) and its step's command."""

    job: str  # the run's number in the sweep (its folder name)
    run_dir: str
    label: str  # the overrides that make it
    nodes: int
    tasks_per_node: int
    gpus_per_task: int
    cpus_per_task: int
    command: List[str]  # what each task of its job step runs
    environment: Dict[str, str] = field(default_factory=dict)  # exported to its step (besides PACKED_ENV)
    srun_flags: List[str] = field(default_factory=list)  # its container's srun flags (hpc_train.containers)
    unset: List[str] = field(default_factory=list)  # variables its step does not get (the launching Python's)

    @property
    def gpus_per_node(self) -> int:
        return self.tasks_per_node * self.gpus_per_task

    @property
    def cpus_per_node(self) -> int:
        return self.tasks_per_node * self.cpus_per_task


@dataclass
class AllocationPlan:
    """One allocation: its shape, its time limit, the runs it takes (in order) and, once submitted, its job id."""

    index: int
    nodes: int
    gpus_per_node: int
    cpus_per_node: int
    minutes: int
    signal: str  # launcher.signal as Slurm spells it (USR2): the allocation's, sent on to its running steps
    signal_delay_s: int
    max_requeues: int
    runs: List[PackedRun]
    job_id: Optional[str] = None
    # The sbatch parameters its batch script was rendered from (hpc_train.launch.backends.slurm.packed.render: job name,
    # nodes, tasks, CPUs, GPUs, time, partition, account, QOS, constraint, memory, setup lines, the other flags),
    # as data: what --rerun-failed renders a new allocation from. None: a plan written before they were recorded.
    sbatch: Optional[Dict[str, Any]] = None
    # Fed (hpc_train.pack.feed): its pool also takes runs from the sweep's feed while it runs, until the feed closes
    # (an adaptive study's allocations, whose plans start empty). False: its plan is all it runs.
    fed: bool = False

    def to_json(self) -> Dict[str, Any]:
        return asdict(self)

    @staticmethod
    def from_json(data: Dict[str, Any]) -> "AllocationPlan":
        runs = [PackedRun(**run) for run in data["runs"]]
        return AllocationPlan(**{**data, "runs": runs})


class Shape(Protocol):
    """What an allocation is: a PackShape (hpc_train.launch.backends.slurm.packed), or an earlier allocation's plan."""

    nodes: int
    gpus_per_node: int
    cpus_per_node: int
    minutes: int


def new_plan(
    index: int,
    shape: Shape,
    signal: str,
    signal_delay_s: int,
    max_requeues: int,
    runs: List[PackedRun],
    sbatch: Optional[Dict[str, Any]] = None,
    fed: bool = False,
) -> AllocationPlan:
    """An allocation's plan, not yet submitted: a packed sweep's (launch.backends.packed) and a rerun's
    (launch.backends.packed_rerun, shaped as an earlier allocation) alike."""
    return AllocationPlan(
        index=index,
        nodes=shape.nodes,
        gpus_per_node=shape.gpus_per_node,
        cpus_per_node=shape.cpus_per_node,
        minutes=shape.minutes,
        signal=signal,
        signal_delay_s=signal_delay_s,
        max_requeues=max_requeues,
        runs=list(runs),
        sbatch=sbatch,
        fed=fed,
    )


def folder(sweep_dir: Path) -> Path:
    return Path(sweep_dir) / FOLDER


def plan_path(sweep_dir: Path, index: int) -> Path:
    return folder(sweep_dir) / f"allocation_{index}.json"


def events_path(sweep_dir: Path, index: int) -> Path:
    return folder(sweep_dir) / f"allocation_{index}.events.jsonl"


def write_plan(sweep_dir: Path, plan: AllocationPlan) -> Path:
    """Atomically (a reader never sees half a plan)."""
    path = plan_path(sweep_dir, plan.index)
    with rundir.recording(path, "the sweep's earlier records are kept"):
        rundir.write_text_atomic(path, json.dumps(plan.to_json(), indent=1) + "\n")
    return path


def read_plan(path: Path) -> AllocationPlan:
    return AllocationPlan.from_json(json.loads(Path(path).read_text()))


def read_plans(sweep_dir: Path) -> List[AllocationPlan]:
    """Every allocation of the sweep (a rerun's included), by index."""
    found = []
    for path in folder(sweep_dir).glob("allocation_*.json"):
        try:
            found.append(read_plan(path))
        except (OSError, ValueError, TypeError, KeyError):
            continue  # being written (never: written atomically) or not ours
    return sorted(found, key=lambda plan: plan.index)


def next_index(plans: List[AllocationPlan]) -> int:
    """The index the next allocation takes, after every one of `plans` (the sweep's, as read_plans read them)."""
    return max((plan.index for plan in plans), default=-1) + 1


def append_event(sweep_dir: Path, index: int, event: str, **fields: Any) -> None:
    """One line, flushed and fsynced: the report may read it from another host a moment later."""
    path = events_path(sweep_dir, index)
    line = json.dumps({"time": time.time(), "event": event, **fields}) + "\n"
    with path.open("a") as handle:
        handle.write(line)
        handle.flush()
        os.fsync(handle.fileno())


def read_events(sweep_dir: Path, index: int) -> List[Dict[str, Any]]:
    path = events_path(sweep_dir, index)
    if not path.exists():
        return []
    events = []
    for line in path.read_text().splitlines():
        try:
            events.append(json.loads(line))
        except ValueError:
            continue  # a line cut short by a crash mid-write
    return events


def runs_of(plan: AllocationPlan, events: List[Dict[str, Any]]) -> List[PackedRun]:
    """The runs an allocation has: its plan's, then those its pool took from the feed (its ``claimed`` events)."""
    fed = [PackedRun(**event["entry"]) for event in events if event.get("event") == CLAIMED and "entry" in event]
    return [*plan.runs, *fed]


def finished(sweep_dir: Path, index: int) -> bool:
    """Whether the allocation's scheduler ended for good (its last event ``finished``, not a requeue)."""
    events = read_events(sweep_dir, index)
    return bool(events) and events[-1].get("event") == "finished"


def srun_log_path(run_dir: Path, allocation_job_id: str) -> Path:
    """Where srun's own messages about a run's steps in one allocation go (its tasks' go to their --error files)."""
    return Path(run_dir) / SLURM_LOGS / f"{allocation_job_id}_srun.err"


def refusal(run: "RunState") -> Optional[str]:
    """Slurm's refusal of the run's job step in Slurm's words, and the file that holds them; None when srun said
    nothing of its own about the step."""
    return f"Slurm refused its job step: {run.said} (in {run.srun_log})" if run.said else None


def packed_id(allocation_job_id: str, job: str) -> str:
    return f"{allocation_job_id}:{job}"


def is_packed_id(job_id: str) -> bool:
    return ":" in str(job_id)


def split_packed_id(job_id: str) -> tuple:
    allocation, _, job = str(job_id).partition(":")
    return allocation, job


@dataclass(frozen=True)
class RunState:
    """Where one packed run stands, from its allocations' records."""

    state: str
    allocation: int  # the index of the allocation that has it (the newest, after a rerun)
    job_id: Optional[str]  # that allocation's Slurm job id
    exit_code: Optional[int] = None
    started: Optional[float] = None
    ended: Optional[float] = None
    hosts: str = ""
    said: str = ""  # srun's own error about its step (Slurm refused it), in Slurm's words; "" when none
    srun_log: str = ""  # the file that holds it


def run_states(
    sweep_dir: Path,
    allocation_ended: Optional[Dict[str, bool]] = None,
    plans: Optional[List[AllocationPlan]] = None,
) -> Dict[str, RunState]:
    """Each packed run's state, by its number: the newest allocation that lists it decides (a rerun's).

    `allocation_ended`: Slurm's word on each allocation's job id (True: it has ended, for good); a run its
    allocation never finished is then CANCELLED rather than WAITING or RUNNING. `plans`: the sweep's plans, read
    already (read now when None).
    """
    states: Dict[str, RunState] = {}
    for plan in read_plans(sweep_dir) if plans is None else plans:
        events = read_events(sweep_dir, plan.index)
        listed = {run.job: RunState(WAITING, plan.index, plan.job_id) for run in runs_of(plan, events)}
        for event in events:
            job = event.get("run")
            if job not in listed:
                continue
            current = listed[job]
            if event["event"] == "started":
                listed[job] = RunState(
                    RUNNING, plan.index, plan.job_id, None, event["time"], None, event.get("hosts", "")
                )
            elif event["event"] == "ended":
                listed[job] = RunState(
                    event["state"],
                    plan.index,
                    plan.job_id,
                    event.get("exit_code"),
                    current.started,
                    event["time"],
                    current.hosts,
                    event.get("said", ""),
                    event.get("srun_log", ""),
                )
        over = bool((allocation_ended or {}).get(str(plan.job_id)))
        for job, state in listed.items():
            if over and state.state in (WAITING, RUNNING, INTERRUPTED):
                state = replace(state, state=CANCELLED)
            states[job] = state
    return states
