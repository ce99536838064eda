"""`python -m hpc_train.pack.scheduler PLAN.json`: a packed allocation's batch script, starting its runs as job steps.

One process on the allocation's batch host. It starts each run of its plan (hpc_train.pack.records) as a job step
(``srun --exact`` with the run's own nodes, tasks, CPUs and GPUs), as many at once as fit, and the next as soon as a
step ends: first fit, in the plan's order, by free GPUs and CPUs on each node (a multi-node run takes the first
nodes with room). Slurm binds each step to its own GPUs (``--gres`` on every step, ``none`` for a run without GPUs;
``CUDA_VISIBLE_DEVICES`` per step) and CPUs (``--exact``); ``--mem=0`` lets a step use the node's memory without
holding it from the other steps. The allocation's own GPU request (``SLURM_GPUS_PER_NODE`` and its kin, which srun
reads as the step's defaults) is left out of each step's environment: the step's ``--gres`` alone says what it gets.
srun's own words about a step (a refusal such as "Unable to create step") go to the run's
``slurm/<allocation>_srun.err``, and its first error line into the run's ``ended`` event (``said``, ``srun_log``).

A fed allocation (an adaptive study's, hpc_train.pack.feed) also takes runs from the sweep's feed while it runs: once
its own runs are placed, each fed run that fits now is claimed (a rename: one pool wins it), recorded (``claimed``)
and started the same way; it ends once the feed is closed and its steps have ended, or at its time limit. A fixed
plan is a feed closed from the start: the same loop, nothing taken.

One run failing (its step's exit code, a hang, a killed step) does not stop the others. On the allocation's signal
(``#SBATCH --signal=B:<sig>@<s>``, to this process only) it sends the signal to every running step (srun passes it to
its tasks, which checkpoint and exit), starts nothing more, waits for them, and requeues the allocation while runs
are left and requeues remain. After a restart, runs that ended are skipped and the interrupted ones resume from their
own checkpoints. A run is not started when the allocation's time left before the signal is shorter than the longest
run of the sweep that completed so far (the only time known in advance). Exit code: 0 when every run completed,
1 otherwise. No torch here: the runs' steps import it, not the scheduler.
"""

from __future__ import annotations

import dataclasses
import datetime
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional

from hpc_train.pack import feed, records
from hpc_train.pack.records import AllocationPlan, PackedRun
from hpc_train.processes.rank_env import STEP_PORTS, step_port
from hpc_train.processes.signal_relay import handling
from hpc_train.records import rundir
from hpc_train.slurm import slurm_cli
from hpc_train.slurm.hostlist import expand_hostlist

POLL_S = 0.2
_SIGNALS = {"USR1": signal.SIGUSR1, "USR2": signal.SIGUSR2}
# A step's exit code -> the run's state (the worker's codes: hpc_train.records.rundir).
_ENDINGS = {rundir.EXIT_OK: records.COMPLETED, rundir.EXIT_INTERRUPTED: records.INTERRUPTED}
# The allocation's GPU request as srun reads it from the environment (sbatch sets them from --gpus-per-node and its
# kin): a step's own --gres is its whole GPU request, and with SLURM_GPUS_PER_NODE inherited srun refuses
# `--gres none` ("Invalid Trackable RESource (TRES) specification") and gives `--gres gpu:0` every GPU of the node.
ALLOCATION_GPU_VARIABLES = (
    "SLURM_GPUS",
    "SLURM_GPUS_PER_NODE",
    "SLURM_GPUS_PER_TASK",
    "SLURM_GPUS_PER_SOCKET",
    "SLURM_TRES_PER_TASK",
)


@dataclass
class Node:
    name: str
    gpus: int  # free
    cpus: int  # free


@dataclass
class Step:
    run: PackedRun
    process: subprocess.Popen
    nodes: List[str]
    slot: int
    srun_log: Path  # srun's own stderr for this step (its tasks' go to --error)
    srun_offset: int  # where this step's lines begin in it
    started: float = field(default_factory=time.time)


class Scheduler:
    def __init__(self, plan: AllocationPlan, sweep_dir: Path, environ: Dict[str, str]) -> None:
        self.plan, self.sweep_dir, self.environ = plan, sweep_dir, environ
        self.job_id = environ.get("SLURM_JOB_ID", "0")
        self.restart = int(environ.get("SLURM_RESTART_COUNT", "0") or 0)
        hosts = expand_hostlist(environ.get("SLURM_JOB_NODELIST", "localhost"))
        self.nodes = [Node(host, plan.gpus_per_node, plan.cpus_per_node) for host in hosts]
        self.running: List[Step] = []
        self.stopping = False
        self.end_time: Optional[float] = None  # when Slurm ends the allocation (read at the start of run())

    # -- the pool ----------------------------------------------------------------------
    def left(self) -> List[PackedRun]:
        """The plan's runs that have not ended in an earlier attempt (in the plan's order), and that no newer
        allocation (a rerun's) has taken over: one run dir is never run by two allocations at once."""
        states = records.run_states(self.sweep_dir)
        return [
            run
            for run in self._runs()
            if run.job in states
            and states[run.job].allocation == self.plan.index
            and states[run.job].state not in (records.COMPLETED, records.FAILED)
        ]

    def _runs(self) -> List[PackedRun]:
        """Its plan's runs, and (fed) those its pool took from the feed so far."""
        if not self.plan.fed:
            return self.plan.runs
        return records.runs_of(self.plan, records.read_events(self.sweep_dir, self.plan.index))

    def _feed_open(self) -> bool:
        """Whether runs may still come from the feed (a fixed plan's feed is closed from the start)."""
        return self.plan.fed and not feed.is_closed(self.sweep_dir)

    def run(self) -> int:
        self.end_time = _end_time(self.job_id)
        records.append_event(self.sweep_dir, self.plan.index, "began", job_id=self.job_id, restart=self.restart)
        waiting = self.left()
        signals = [number for name, number in _SIGNALS.items() if name == self.plan.signal] + [signal.SIGTERM]
        with handling(signals, self._on_signal):  # the allocation's signal and Slurm's SIGTERM, while the pool runs
            while waiting or self.running or (self._feed_open() and not self.stopping):
                if not self.stopping:
                    waiting = self._start_what_fits(waiting)
                if not self.stopping and not waiting and self.plan.fed:
                    self._take_from_feed()
                self._reap()
                if self.stopping and not self.running:
                    break
                if not self.running and waiting and not self.stopping:
                    if not any(self._fits_now(run) for run in waiting) and not self._any_time_for(waiting):
                        break  # nothing left can finish in this allocation: requeue for a fresh one
                time.sleep(POLL_S)
            return self._finish(waiting)

    def _start_what_fits(self, waiting: List[PackedRun]) -> List[PackedRun]:
        """Room first (in memory), then time (reads every allocation's records): a pass over runs that cannot be
        placed reads no file, so a full allocation's pool neither burns its CPUs nor stats the shared file system."""
        still = []
        for run in waiting:
            placed = self._place(run)
            if placed is None or not self._time_for(run):
                still.append(run)
                continue
            self._start(run, placed)
        return still

    def _take_from_feed(self) -> None:
        """Each fed run that fits now (room and time), claimed (one pool wins it), recorded, then started."""
        if not any(node.cpus for node in self.nodes):  # full: the feed is not even listed
            return
        for entry in feed.waiting(self.sweep_dir):
            placed = self._place(entry.run)
            if placed is None or not self._time_for(entry.run):
                continue
            if not feed.claim(self.sweep_dir, entry, self.plan.index):
                continue
            fields = {"run": entry.run.job, "entry": dataclasses.asdict(entry.run), "fed": entry.fed}
            records.append_event(self.sweep_dir, self.plan.index, records.CLAIMED, **fields)
            self._start(entry.run, placed)

    def _fits_now(self, run: PackedRun) -> bool:
        return self._place(run) is not None and self._time_for(run)

    def _place(self, run: PackedRun) -> Optional[List[Node]]:
        """The first `run.nodes` nodes with room for the run's share of each (None: it must wait)."""
        fit = [n for n in self.nodes if n.gpus >= run.gpus_per_node and n.cpus >= run.cpus_per_node]
        return fit[: run.nodes] if len(fit) >= run.nodes else None

    def _start(self, run: PackedRun, nodes: List[Node]) -> None:
        for node in nodes:
            node.gpus -= run.gpus_per_node
            node.cpus -= run.cpus_per_node
        slot = min(set(range(STEP_PORTS)) - {step.slot for step in self.running})
        dropped = {*run.unset, *ALLOCATION_GPU_VARIABLES}
        env = {
            **{key: value for key, value in os.environ.items() if key not in dropped},
            **run.environment,
            records.PACKED_ENV: f"{self.job_id}:{run.job}",
            "MASTER_PORT": str(step_port(self.job_id, slot)),
        }
        srun_log = records.srun_log_path(Path(run.run_dir), self.job_id)
        srun_log.parent.mkdir(parents=True, exist_ok=True)
        command = [*step_command(run, [n.name for n in nodes], srun_log.parent), *run.srun_flags, *run.command]
        with srun_log.open("a") as stderr:  # the submission's directory, as a job's
            offset = stderr.tell()
            process = subprocess.Popen(command, env=env, stdin=subprocess.DEVNULL, stderr=stderr)
        self.running.append(Step(run, process, [n.name for n in nodes], slot, srun_log, offset))
        records.append_event(
            self.sweep_dir,
            self.plan.index,
            "started",
            run=run.job,
            hosts=",".join(n.name for n in nodes),
            pid=process.pid,
        )

    def _reap(self) -> None:
        for step in list(self.running):
            code = step.process.poll()
            if code is None:
                continue
            self.running.remove(step)
            for node in self.nodes:
                if node.name in step.nodes:
                    node.gpus += step.run.gpus_per_node
                    node.cpus += step.run.cpus_per_node
            state = _ENDINGS.get(code, records.FAILED)
            said = srun_said(step.srun_log, step.srun_offset) if state == records.FAILED else None
            records.append_event(
                self.sweep_dir,
                self.plan.index,
                "ended",
                run=step.run.job,
                state=state,
                exit_code=code,
                seconds=round(time.time() - step.started, 3),
                **({"said": said, "srun_log": str(step.srun_log)} if said else {}),
            )

    # -- time ---------------------------------------------------------------------------
    def _seconds_left(self) -> Optional[float]:
        if self.end_time is None:
            return None
        return self.end_time - time.time() - self.plan.signal_delay_s

    def _longest_completed(self) -> Optional[float]:
        longest = None
        for plan in records.read_plans(self.sweep_dir):
            for event in records.read_events(self.sweep_dir, plan.index):
                if event.get("event") == "ended" and event.get("state") == records.COMPLETED and "seconds" in event:
                    longest = max(longest or 0.0, float(event["seconds"]))
        return longest

    def _time_for(self, run: PackedRun) -> bool:
        """Started only if the longest completed run of the sweep would end before the signal (unknown: started)."""
        left, expected = self._seconds_left(), self._longest_completed()
        return left is None or expected is None or expected <= left

    def _any_time_for(self, waiting: List[PackedRun]) -> bool:
        return any(self._time_for(run) for run in waiting)

    # -- the end ---------------------------------------------------------------------------
    def _on_signal(self, number: int, _frame) -> None:
        if self.stopping:
            return
        self.stopping = True
        self.terminated = number == signal.SIGTERM
        name = signal.Signals(number).name
        records.append_event(
            self.sweep_dir, self.plan.index, "signal", signal=name, running=[s.run.job for s in self.running]
        )
        for step in self.running:  # srun passes the signal on to the step's tasks: they checkpoint and exit
            try:
                step.process.send_signal(number)
            except ProcessLookupError:
                pass

    terminated = False  # Slurm's SIGTERM (scancel, scontrol requeue, the time limit): Slurm decides what comes next

    def _finish(self, waiting: List[PackedRun]) -> int:
        unfinished = [run.job for run in self.left()]
        if self.terminated:  # requeued by someone else, cancelled or out of time: Slurm's state of the job tells which
            records.append_event(self.sweep_dir, self.plan.index, "terminated", runs=unfinished)
            return 1 if unfinished else 0
        if unfinished and (self.stopping or waiting) and self.restart < self.plan.max_requeues:
            done = slurm_cli.run(["scontrol", "requeue", self.job_id], hold_sigterm=True)
            records.append_event(
                self.sweep_dir,
                self.plan.index,
                "requeued" if done.returncode == 0 else "requeue_failed",
                runs=unfinished,
                said=slurm_cli.said(done) if done.returncode else "",
            )
            if done.returncode == 0:
                return 0
        runs = self._runs()
        mine = {run.job for run in runs}
        failed = [
            job
            for job, state in records.run_states(self.sweep_dir).items()
            if job in mine and state.state != records.COMPLETED
        ]
        records.append_event(self.sweep_dir, self.plan.index, "finished", not_completed=failed)
        print(
            f"hpc-train: allocation {self.plan.index} (job {self.job_id}) ended: "
            + (
                f"{len(failed)} of {len(runs)} runs did not complete ({', '.join(failed)})"
                if failed
                else f"all {len(runs)} runs completed"
            ),
            flush=True,
        )
        return 1 if failed else 0


# srun's lines about a task of a step that started (its exit, its signal): the task's own stderr says more
_TASK_LINE = re.compile(r": tasks? [0-9,-]+: ")


def srun_said(path: Path, offset: int = 0) -> Optional[str]:
    """srun's own first error about a step (Slurm's refusal of it, in Slurm's words), from its stderr file past
    `offset` (the file is appended to by each step of the run in that allocation); None when it wrote none, or only
    reported a task's exit."""
    try:
        with path.open("rb") as handle:
            handle.seek(offset)
            lines = handle.read().decode(errors="replace").splitlines()
    except OSError:
        return None
    for line in lines:
        line = line.strip()
        if line.startswith(("srun: error:", "srun: fatal:")) and not _TASK_LINE.search(line):
            return line
    return None


def step_command(run: PackedRun, nodes: List[str], log_dir: Path) -> List[str]:
    """The srun line of one run's job step: its own nodes, tasks, CPUs and GPUs, nothing more (--exact)."""
    gpus = ["--gres", f"gpu:{run.gpus_per_node}"] if run.gpus_per_node else ["--gres", "none"]
    return [
        "srun",
        "--exact",
        "--unbuffered",
        f"--nodes={run.nodes}",
        f"--ntasks={run.nodes * run.tasks_per_node}",
        f"--ntasks-per-node={run.tasks_per_node}",
        f"--cpus-per-task={run.cpus_per_task}",
        *gpus,
        "--mem=0",
        f"--nodelist={','.join(nodes)}",
        "--kill-on-bad-exit=1",
        f"--job-name=run{run.job}",
        "--output",
        str(log_dir / "%j_%s_%t_log.out"),
        "--error",
        str(log_dir / "%j_%s_%t_log.err"),
    ]


def _end_time(job_id: str) -> Optional[float]:
    """When Slurm ends this allocation (scontrol's EndTime, local time), as a timestamp; None when unknown."""
    text = slurm_cli.show_job(job_id).get("EndTime", "")
    try:
        return datetime.datetime.strptime(text, "%Y-%m-%dT%H:%M:%S").timestamp()
    except ValueError:
        return None


def main(argv: Optional[List[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m hpc_train.pack.scheduler SWEEP_DIR/.hpc_train/pack/allocation_K.json", file=sys.stderr)
        return rundir.EXIT_REFUSED
    path = Path(argv[0]).resolve()
    sweep_dir = path.parent.parent.parent
    return Scheduler(records.read_plan(path), sweep_dir, dict(os.environ)).run()


if __name__ == "__main__":
    sys.exit(main())
