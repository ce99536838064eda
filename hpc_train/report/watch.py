"""`hpc-train-report SWEEP_DIR --watch`: a sweep's live state, redrawn every few seconds until every job has ended.

Each refresh reads, for all jobs at once, Slurm's states (``job_states.slurm_job_states``: one
sacct call per batch of arrays; without accounting, squeue and the ended jobs' run dirs) or,
for a local sweep, what its run dirs hold; then, for the
running jobs only, the last lines of ``metrics.jsonl`` (step, loss, samples/s between the last
two logged steps), and for the failed ones the failing rank's one-line error and where its log
is. The ETA is the finished jobs' mean duration times the jobs left, divided by how many run
at once. The runs of a packed sweep (``launcher.pack``) read their states, times and running count from
their allocations' own records (hpc_train.pack.status), their failures from their own logs. A Slurm job requeued
while watched is said in ``launcher.wait``'s line, once (hpc_train.jobs.requeues counts its attempts as the
follower does). Plain text (redrawn in place on a terminal), no torch, no new dependency.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Callable, Dict, List, Optional, Set, Tuple

import yaml

from hpc_train.jobs import job_table
from hpc_train.jobs.job_states import ENDED, FROM_RUN_DIRS, first_rank_error, slurm_job_states
from hpc_train.jobs.requeues import Requeues, accounted_attempts
from hpc_train.jobs.sweep_status import MULTIRUN, never_running
from hpc_train.launch.hydra.cli_child import expand
from hpc_train.pack import records, status
from hpc_train.records import rundir
from hpc_train.report import app_report, packed_runs, study_report

REFRESH_S = 5.0
FAILED_SHOWN = 10  # failed jobs listed with their error (the count covers all of them)
RUNNING_SHOWN = 20
TAIL_BYTES = 8192  # the end of metrics.jsonl read to find the last two training steps


@dataclass
class WatchedJob:
    name: str  # job number in the sweep
    run_dir: Path
    slurm_id: Optional[str] = None
    state: str = "PENDING"
    elapsed_s: Optional[float] = None
    step: Optional[int] = None
    loss: Optional[float] = None
    samples_per_sec: Optional[float] = None
    error: Optional[str] = None
    log: Optional[Path] = None
    allocation: Optional[str] = None  # a packed run: the Slurm job id of the allocation that has it
    more_logs: List[Path] = field(default_factory=list)  # a packed run: its step's stderr, besides `log`


@dataclass
class Snapshot:
    jobs: List[WatchedJob]
    counts: Dict[str, int] = field(default_factory=dict)
    from_run_dirs: bool = False  # accounting did not answer: ended jobs' states are their run dirs' records
    slurm: Dict[str, Optional[str]] = field(default_factory=dict)  # the sweep's own Slurm jobs: Slurm's state or None

    @property
    def done(self) -> bool:
        return bool(self.jobs) and all(job.state in ENDED for job in self.jobs)

    @property
    def failed(self) -> List[WatchedJob]:
        return [job for job in self.jobs if job.state in ENDED and job.state != "COMPLETED"]


# -- which jobs the sweep has ----------------------------------------------------------------------
def _local_jobs(sweep_dir: Path) -> int:
    """How many jobs a local sweep has: Hydra's expansion of the overrides it saved in multirun.yaml."""
    try:
        saved = yaml.safe_load((sweep_dir / MULTIRUN).read_text())
        overrides = [str(o) for o in saved["hydra"]["overrides"]["task"]]
    except (OSError, yaml.YAMLError, KeyError, TypeError):
        return 0
    try:
        return len(expand(overrides))
    except Exception:  # noqa: BLE001 - an optimising sweeper's search space: count what exists
        return 0


def _started(run_dir: Path) -> bool:
    return (run_dir / ".hydra").exists() or (run_dir / rundir.JOB_CONFIG).exists()


# -- what each job is doing ----------------------------------------------------------------------
def _last_train_steps(run_dir: Path) -> List[dict]:
    """The last two ``"kind": "train"`` records of metrics.jsonl (read from its end)."""
    path = run_dir / rundir.METRICS
    try:
        with path.open("rb") as handle:
            handle.seek(0, os.SEEK_END)
            handle.seek(max(0, handle.tell() - TAIL_BYTES))
            lines = handle.read().decode(errors="replace").splitlines()
    except OSError:
        return []
    found = []
    for line in reversed(lines):
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if record.get("kind") == "train":
            found.append(record)
            if len(found) == 2:
                break
    return list(reversed(found))


_BATCH: Dict[Path, Optional[int]] = {}


def _global_batch(run_dir: Path) -> Optional[int]:
    if run_dir not in _BATCH:
        try:
            spec = yaml.load((run_dir / rundir.JOB_CONFIG).read_text(), Loader=getattr(yaml, "CSafeLoader", None))
            _BATCH[run_dir] = int(spec["trainer"]["batch_size"])
        except (OSError, yaml.YAMLError, KeyError, TypeError, ValueError):
            return None
    return _BATCH[run_dir]


def _progress(job: WatchedJob) -> None:
    steps = _last_train_steps(job.run_dir)
    if not steps:
        return
    job.step, job.loss = steps[-1].get("step"), steps[-1].get("loss")
    if len(steps) == 2:
        first, last = steps
        batch = _global_batch(job.run_dir)
        span = float(last.get("time", 0)) - float(first.get("time", 0))
        if batch and span > 0:
            job.samples_per_sec = (int(last["step"]) - int(first["step"])) * batch / span


def _failure(job: WatchedJob, sweep_dir: Path) -> None:
    rank, error = first_rank_error(job.run_dir, 0.0)
    if error:
        job.error, job.log = error, rundir.rank_log(job.run_dir, rank or 0)
        return
    logs = sorted((sweep_dir / rundir.SLURM_LOGS).glob(f"{job.slurm_id}_*log.err")) if job.slurm_id else []
    logs = logs or sorted((job.run_dir / rundir.SLURM_LOGS).glob("*_log.err"))
    job.log = logs[0] if logs else job.run_dir / rundir.LOGS
    for path in logs[:1]:
        try:
            lines = [line for line in path.read_text(errors="replace").splitlines() if line.strip()]
        except OSError:
            continue
        said = next((line for line in lines if "Error" in line or "error" in line), lines[-1] if lines else None)
        job.error = job.error or said  # what the run dir recorded (no accounting) comes first


def packed_jobs(sweep_dir: Path, rows: List[Tuple[str, str]]) -> List[WatchedJob]:
    """The packed runs of `rows` (packed id, run number) as their allocations' records say, with one Slurm call."""
    found = status.read(sweep_dir)
    return [
        watched_run(Path(found.run_dirs.get(name, sweep_dir / name)), job_id, name, found.of(job_id), found.allocations)
        for job_id, name in rows
    ]


def watched_run(
    run_dir: Path, job_id: str, name: str, run: Optional[records.RunState], allocations: Dict[str, str]
) -> WatchedJob:
    """One packed run, in its run dir (a Hydra app's: its run folder), from its records' state (None: no
    allocation lists it, yet)."""
    job = WatchedJob(name, run_dir, job_id, records.WAITING)
    job.allocation = str(run.job_id) if run and run.job_id else records.split_packed_id(job_id)[0]
    if run is None:
        return job
    job.state, job.elapsed_s = run.state, status.run_seconds(run)
    if run.state in (records.FAILED, records.CANCELLED):
        job.error = packed_runs.why(job.run_dir, run, allocations.get(job.allocation))
        logs = packed_runs.logs(job.run_dir, job.allocation) or [job.run_dir / rundir.LOGS]
        job.log, job.more_logs = logs[0], logs[1:]
    return job


def _local_elapsed(run_dir: Path) -> Optional[float]:
    try:
        return (run_dir / rundir.SUMMARY).stat().st_mtime - (run_dir / ".hydra").stat().st_mtime
    except OSError:
        return None


def snapshot(sweep_dir: Path) -> Snapshot:
    """Every job of the sweep with its state; progress for running jobs, the cause for failed ones."""
    local_app = app_report.is_local_app_sweep(sweep_dir)
    rows = [] if local_app else [(row.job_id, row.job) for row in job_table.newest(sweep_dir).values()]
    from_run_dirs = False
    slurm: Dict[str, Optional[str]] = {}
    if local_app:  # processes of this host: the result files say
        jobs = [
            WatchedJob(
                r["job"],
                sweep_dir / r["job"],
                r["job_id"],
                r["state"],
                error=r["result"] if r["state"] == "FAILED" else None,
                log=r["log"] and Path(r["log"]),
            )
            for r in app_report.rows(sweep_dir)
        ]
    elif rows:
        packed = [(job_id, name) for job_id, name in rows if records.is_packed_id(job_id)]
        rows = [(job_id, name) for job_id, name in rows if not records.is_packed_id(job_id)]
        states = slurm_job_states((job_id for job_id, _ in rows), {job_id: sweep_dir / name for job_id, name in rows})
        from_run_dirs = any(found.from_run_dir for found in states.values())
        jobs = packed_jobs(sweep_dir, packed) if packed else []
        for job_id, name in rows:
            job = WatchedJob(name, sweep_dir / name, job_id)
            found = states.get(job_id)
            slurm[job_id] = found.state if found is not None else None
            if found is not None:
                job.state, job.elapsed_s, job.error = found.state, found.elapsed_s, found.error
            elif (job.run_dir / rundir.SUMMARY).exists():
                job.state = "COMPLETED"
            jobs.append(job)
    else:
        total = _local_jobs(sweep_dir)
        started = sorted(int(p.name) for p in sweep_dir.iterdir() if p.name.isdigit() and _started(p))
        total = max(total, (started[-1] + 1) if started else 0)
        newest = started[-1] if started else -1
        jobs = []
        for number in range(total):
            job = WatchedJob(str(number), sweep_dir / str(number))
            if (job.run_dir / rundir.SUMMARY).exists():
                job.state, job.elapsed_s = "COMPLETED", _local_elapsed(job.run_dir)
            elif number in started and (number < newest or first_rank_error(job.run_dir, 0.0)[1]):
                job.state = "FAILED"  # a later job started (local sweeps run one at a time), or a rank failed
            elif number in started:
                job.state = "RUNNING"
            jobs.append(job)
    for job in jobs:
        if job.state == "RUNNING":
            _progress(job)
        elif job.state in ENDED and job.state != "COMPLETED" and job.log is None:
            _failure(job, sweep_dir)
    counts: Dict[str, int] = {}
    for job in jobs:
        counts[job.state] = counts.get(job.state, 0) + 1
    return Snapshot(jobs, counts, from_run_dirs, slurm)


class RequeueNotes:
    """launcher.wait's line for each requeue of the sweep's Slurm jobs, each said once: their attempts counted as the
    follower counts them (hpc_train.jobs.requeues), at every look until the job ended, then accounting's count of its
    attempts (one sacct call for the jobs that ended since the last look)."""

    def __init__(self) -> None:
        self.jobs: Dict[str, Requeues] = {}
        self.ended: Set[str] = set()
        self.said: List[str] = []

    def note(self, snap: Snapshot) -> List[str]:
        """The lines new since the last snapshot."""
        before = len(self.said)
        run_dirs = {job.slurm_id: job.run_dir for job in snap.jobs if job.slurm_id in snap.slurm}
        ended = []
        for job_id, state in snap.slurm.items():
            if job_id in self.ended:
                continue
            if job_id not in self.jobs:
                run_dir = run_dirs[job_id]
                self.jobs[job_id] = Requeues(job_id, run_dir, rundir.launched_at(run_dir), self.said.append)
            self.jobs[job_id].note(state)
            if state in ENDED:
                ended.append(job_id)
        attempts = accounted_attempts(ended) if ended else {}
        for job_id in ended:
            self.jobs[job_id].note_accounted(attempts.get(job_id, 0))
            self.ended.add(job_id)
        return self.said[before:]


# -- showing it ------------------------------------------------------------------------------------
def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    hours, rest = divmod(seconds, 3600)
    return f"{hours}h{rest // 60:02d}m" if hours else f"{rest // 60}m{rest % 60:02d}s"


def eta(snap: Snapshot) -> Optional[float]:
    """Seconds until the last job ends: mean duration of the finished jobs x waves of jobs left."""
    durations = [j.elapsed_s for j in snap.jobs if j.state in ENDED and j.elapsed_s]
    left = [j for j in snap.jobs if j.state not in ENDED]
    if not durations or not left:
        return None if left else 0.0
    running = sum(1 for j in left if j.state == "RUNNING")
    mean = sum(durations) / len(durations)
    return math.ceil(len(left) / max(1, running)) * mean


def render(sweep_dir: Path, snap: Snapshot) -> str:
    total = len(snap.jobs)
    order = ["COMPLETED", "RUNNING", "PENDING"]
    names = order + sorted(s for s in snap.counts if s not in order)
    counts = ", ".join(f"{snap.counts[s]:,} {s}" for s in names if snap.counts.get(s))
    left = eta(snap)
    lines = [
        f"hpc-train-report --watch {sweep_dir}  ({time.strftime('%H:%M:%S')})",
        f"{total:,} job{'s' if total != 1 else ''}: {counts or 'none yet'}"
        + (f"; ETA {_duration(left)}" if left else ""),
    ]
    if snap.from_run_dirs:
        lines.append(f"({FROM_RUN_DIRS})")
    running = [j for j in snap.jobs if j.state == "RUNNING"]
    if running:
        lines.append("running:   job  slurm id      step      loss  samples/s")
        for job in running[:RUNNING_SHOWN]:
            lines.append(
                f"{'':11s}{job.name:>4s}  {job.slurm_id or '-':12s}"
                f"{job.step if job.step is not None else '-':>6}"
                f"{f'{job.loss:.4f}' if isinstance(job.loss, (int, float)) else '-':>10s}"
                f"{f'{job.samples_per_sec:.1f}' if job.samples_per_sec else '-':>11s}"
            )
        if len(running) > RUNNING_SHOWN:
            lines.append(f"{'':11s}... and {len(running) - RUNNING_SHOWN:,} more running")
    failed = snap.failed
    if failed:
        lines.append(f"failed ({len(failed):,}):")
        for job in failed[:FAILED_SHOWN]:
            who = f"(allocation {job.allocation})" if job.allocation else job.slurm_id or ""
            lines.append(f"  #{job.name} {who} {job.state}: {job.error or '(no error recorded)'}")
            lines += [f"      log: {log}" for log in [job.log, *job.more_logs]]
        if len(failed) > FAILED_SHOWN:
            lines.append(f"  ... and {len(failed) - FAILED_SHOWN:,} more (hpc-train-report {sweep_dir} lists them)")
    return "\n".join(lines)


def watch(
    sweep_dir: Path, every: float = REFRESH_S, out: IO[str] = sys.stdout, refresh: Optional[Callable[[], None]] = None
) -> int:
    """Redraw until every job (an adaptive study: every trial) has ended; 0 when all completed, 1 when some did not
    (Ctrl-C stops watching only).

    refresh: run before each redraw (a laptop's copy of a cluster's sweep dir brought up to date)."""
    redraw = out.isatty()
    sweep_look = _sweep_look(redraw)
    try:
        while True:
            if refresh is not None:
                refresh()
            look = study_report.look if study_report.is_study(sweep_dir) else sweep_look  # its journal may come later
            text, code = look(sweep_dir)
            out.write(("\033[H\033[J" if redraw else "") + text + "\n" + ("" if redraw else "\n"))
            out.flush()
            if code is not None:
                return code
            time.sleep(every)
    except KeyboardInterrupt:
        out.write("hpc-train-report: stopped watching (the jobs go on)\n")
        return rundir.EXIT_CTRL_C


def _sweep_look(redraw: bool) -> Callable[[Path], Tuple[str, Optional[int]]]:
    """A sweep's look for watch(): (its table now, its exit code once every job has ended, else None); the requeue
    lines under the table (`redraw`: the screen is cleared each time) or once, above the look that found them."""
    requeues = RequeueNotes()

    def look(sweep_dir: Path) -> Tuple[str, Optional[int]]:
        snap = snapshot(sweep_dir)
        text = render(sweep_dir, snap)
        said = requeues.note(snap)
        if redraw:
            text += "".join(f"\n{line}" for line in requeues.said)
        elif said:
            text = "\n".join(said) + "\n" + text
        why = None if snap.done else never_running(sweep_dir)
        if why:
            return text + f"\nhpc-train-report: {why}", 1
        if snap.done:
            return text, 1 if snap.failed else 0
        return text, None

    return look
