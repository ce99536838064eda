"""`hpc-train-report PATH`: a table (and a PNG) of one run dir or of a whole multirun sweep dir.

For every job it reads what the job left behind: ``summary.json`` (strategy, world size,
samples/s, train loss, eval accuracy, attempts), ``metrics.jsonl`` (the loss curve),
``job_config.yaml`` (the layout), ``.hydra/overrides.yaml`` or the sweep's ``jobs.tsv`` (the
overrides and Slurm job ids). Jobs without a summary yet show their Slurm state (``sacct``,
then ``squeue``; where accounting does not answer, an ended job's run dir says how it ended,
and the report says so once). The runs of a packed sweep (``launcher.pack``) show their state from
their allocation's own records (hpc_train.pack.status) and the Slurm id of the allocation that has
them. The PNG holds a bar chart of throughput per job, coloured by strategy, and the training-loss
curve of every job; it needs matplotlib (``pip install 'hpc-train[report]'``).

Login-node safe: no torch import, only small files and two Slurm queries.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

import yaml

from hpc_train.errors import RunDirRefused
from hpc_train.jobs import job_table
from hpc_train.jobs.job_states import ENDED, FROM_RUN_DIRS, NO_RECORD, SlurmState, run_dir_state, slurm_job_states
from hpc_train.jobs.sweep_status import never_running
from hpc_train.jobs.text_table import format_table
from hpc_train.launch.backends.rerun import rerun_failed
from hpc_train.pack import records, status
from hpc_train.records import performance, replicas, rundir
from hpc_train.report import app_report, packed_runs, profile_report, remote_report, study_report
from hpc_train.report.plot import write_png
from hpc_train.report.watch import REFRESH_S, watch

PNG_NAME = "report.png"
PNG_MAX_JOBS = 200  # jobs a bar chart still shows one by one
FAILURES_SHOWN = 10  # jobs listed with why they did not complete (the count covers all of them)
LAYOUT_LEGEND = "layout = nodes x tasks per node x GPUs per task"
INSTALL_HINT = "pip install 'hpc-train[report]'  (or: pip install matplotlib)"


class ReportError(RunDirRefused):
    """A path hpc-train-report cannot report: not a folder, or no run in it; ``str(err)`` says what to give."""


@dataclass
class JobReport:
    name: str  # job number in a sweep, run dir name otherwise
    run_dir: str
    overrides: List[str]
    strategy: Optional[str] = None
    layout: Optional[str] = None  # "nodes x tasks/node x GPUs/task"
    world_size: Optional[int] = None
    status: str = "UNKNOWN"
    samples_per_sec: Optional[float] = None
    tokens_per_sec: Optional[float] = None  # a step that returns tokens (a language model)
    tflops_per_device: Optional[float] = None
    mfu: Optional[float] = None  # None with tflops_per_device: no known peak (a CPU)
    peak_memory_bytes: Optional[int] = None  # the largest rank's
    estimated_memory_bytes: Optional[int] = None  # the memory check's estimate of the largest rank's tensors
    performance: Dict[str, Any] = field(default_factory=dict)  # the summary's breakdown and memory, per rank
    train_loss: Optional[float] = None
    lr: Optional[float] = None  # the first parameter group's LR at the last logged step
    eval_accuracy: Optional[float] = None
    attempts: Optional[int] = None
    slurm_job_id: Optional[str] = None
    slurm_state: Optional[str] = None  # what Slurm says of the job (sacct/squeue), when it was a Slurm job
    error: Optional[str] = None  # an ended job that did not complete: the first line of why, from its run dir
    state_from_run_dir: bool = False  # accounting did not answer: slurm_state is what the run dir recorded
    allocation: Optional[str] = None  # a packed run: the Slurm job id of the allocation that has it
    logs: List[str] = field(default_factory=list)  # a packed run that did not complete: its own logs to read
    loss_curve: List[Tuple[int, float]] = field(default_factory=list)
    image: Optional[str] = None  # the container image the ranks ran in (and its digest), from the summary
    replicas: Optional[str] = None  # a run of replica groups: how many, the steps with fewer, drops and rejoins


# -- reading one run dir ---------------------------------------------------------------------
def _read_yaml(path: Path) -> Any:
    try:
        return yaml.load(path.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    except (OSError, yaml.YAMLError):
        return None


def train_rows(run_dir: Path) -> List[Dict[str, Any]]:
    """The ``"kind": "train"`` lines of metrics.jsonl, in step order (the last write of a step wins)."""
    rows = {int(r["step"]): r for r in rundir.read_jsonl(run_dir / rundir.METRICS) if r.get("kind") == "train"}
    return [rows[step] for step in sorted(rows)]


def loss_curve(rows: Sequence[Dict[str, Any]]) -> List[Tuple[int, float]]:
    """(step, loss) of every train line that has a loss."""
    return [(int(r["step"]), float(r["loss"])) for r in rows if r.get("loss") is not None]


def _attempts_started(run_dir: Path) -> Optional[int]:
    """Attempts counted in attempts.jsonl (starts since the last fresh start), if the file exists."""
    return rundir.attempts_started(run_dir) or None


def _slurm_job_id_of_run(run_dir: Path) -> Optional[str]:
    """A single Slurm job's id, from submitit's ``slurm/<id>_submission.sh``."""
    ids = [p.name.split("_")[0] for p in (run_dir / rundir.SLURM_LOGS).glob("*_submission.sh")]
    ids = [i for i in ids if i.isdigit()]
    return max(ids, key=int) if ids else None


def _failed_locally(run_dir: Path) -> bool:
    for log in (run_dir / rundir.LOGS).glob("rank*.log"):
        try:
            if re.search(r"rank \d+ failed:", log.read_text(errors="replace")):
                return True
        except OSError:
            continue
    return False


def read_job(
    run_dir: Path, name: str, overrides: Optional[List[str]] = None, slurm_job_id: Optional[str] = None
) -> JobReport:
    if overrides is None:
        listed = _read_yaml(run_dir / ".hydra" / "overrides.yaml")
        overrides = [str(o) for o in listed] if isinstance(listed, list) else []
    job = JobReport(
        name=name, run_dir=str(run_dir), overrides=overrides, slurm_job_id=slurm_job_id or _slurm_job_id_of_run(run_dir)
    )
    spec = _read_yaml(run_dir / rundir.JOB_CONFIG)
    layout = (spec or {}).get("job", {}).get("layout") if isinstance(spec, dict) else None
    if isinstance(layout, dict):
        job.strategy = layout.get("strategy")
        nodes = f"{layout.get('nodes')}-{layout['max_nodes']}" if layout.get("max_nodes") else layout.get("nodes")
        job.layout = f"{nodes}x{layout.get('tasks_per_node')}x{layout.get('gpus_per_task')}"
        job.world_size = layout.get("world_size")
    summary = rundir.read_summary(run_dir)
    if summary is not None:
        job.status = "COMPLETED"
        job.strategy = job.strategy or summary.get("strategy")
        job.world_size = summary.get("world_size", job.world_size)
        # images_per_sec: summaries written before the rename
        job.samples_per_sec = summary.get("samples_per_sec", summary.get("images_per_sec"))
        job.tokens_per_sec = summary.get("tokens_per_sec")
        job.tflops_per_device, job.mfu = summary.get(performance.TFLOPS), summary.get(performance.MFU)
        job.peak_memory_bytes = summary.get(performance.MEMORY)
        job.estimated_memory_bytes = performance.estimated_peak(summary)
        job.performance = {key: summary[key] for key in performance.REPORTED if key in summary}
        job.train_loss = summary.get("train_loss")
        job.eval_accuracy = summary.get("eval_accuracy")
        job.attempts = summary.get("attempts") or _attempts_started(run_dir) or 1
        ran = summary.get("python") if isinstance(summary.get("python"), dict) else {}
        if ran.get("image"):
            job.image = f"{ran['image']}" + (f" ({ran['digest']})" if ran.get("digest") else "")
        if replicas.GROUPS in summary:  # fault_tolerance.replica_groups: the drops and rejoins are metrics rows
            job.replicas = replicas.report_line(summary, rundir.read_jsonl(run_dir / rundir.METRICS))
    else:
        job.attempts = _attempts_started(run_dir)
        if job.slurm_job_id is None:
            job.status = "FAILED" if _failed_locally(run_dir) else "NO SUMMARY"
    rows = train_rows(run_dir)
    job.loss_curve = loss_curve(rows)
    job.lr = next((float(r["lr"]) for r in reversed(rows) if isinstance(r.get("lr"), (int, float))), None)
    return job


# -- a sweep dir -----------------------------------------------------------------------------
def collect(path: Path) -> Tuple[str, List[JobReport]]:
    """('run' | 'sweep', jobs) for a run dir or a multirun sweep dir."""
    if not path.is_dir():
        raise ReportError(
            f"{path} is not a folder: give a run dir (outputs/DATE/TIME) or a sweep dir (multirun/DATE/TIME)."
        )
    if rundir.is_run_dir(path) and not (path / rundir.JOB_TABLE).exists():
        return "run", [read_job(path, path.name)]
    table = {number: (row.job_id, row.overrides.split()) for number, row in job_table.newest(path).items()}
    names = set(table) | {p.name for p in path.iterdir() if p.is_dir() and p.name.isdigit() and rundir.is_run_dir(p)}
    if not names:
        raise ReportError(
            f"{path} holds no run: expected summary.json / job_config.yaml (a run dir) or numbered job folders /"
            f" {rundir.JOB_TABLE} (a sweep dir)."
        )
    jobs = []
    for name in sorted(names, key=lambda n: (0, int(n)) if n.isdigit() else (1, n)):
        job_id, overrides = table.get(name, (None, None))
        jobs.append(read_job(path / name, name, overrides, job_id))
    return "sweep", jobs


def apply_slurm_states(jobs: Sequence[JobReport]) -> None:
    """Every Slurm job gets Slurm's state; those without a summary show it as their status (PENDING, FAILED, ...).

    Where accounting does not answer, an ended job's state is what its run dir recorded (job_states.run_dir_state).
    A packed run's state is its allocation's records' (apply_packed_states).
    """
    packed = [job for job in jobs if job.slurm_job_id and records.is_packed_id(job.slurm_job_id)]
    apply_packed_states(packed)
    with_ids = [job for job in jobs if job.slurm_job_id and not records.is_packed_id(job.slurm_job_id)]
    states = slurm_job_states(
        (job.slurm_job_id for job in with_ids), {str(job.slurm_job_id): Path(job.run_dir) for job in with_ids}
    )
    for job in with_ids:
        found = states.get(str(job.slurm_job_id))
        job.slurm_state = found.state if found else None
        job.state_from_run_dir = bool(found and found.from_run_dir)
        if job.status == "COMPLETED":
            continue
        if found is None:
            job.status = "FAILED" if _failed_locally(Path(job.run_dir)) else "NOT IN QUEUE"
        elif found.state == "COMPLETED":
            job.status = "NO SUMMARY"  # Slurm says done, but the job wrote no summary.json
        else:
            job.status = found.state
        if job.status in ENDED:
            job.error = _why(job, found)


def apply_packed_states(jobs: Sequence[JobReport]) -> None:
    """Each packed run gets its state from its allocation's records (WAITING, RUNNING, COMPLETED, FAILED,
    INTERRUPTED, CANCELLED), the allocation that has it, and, when it did not complete, why and its own logs."""
    by_sweep: Dict[Path, List[JobReport]] = {}
    for job in jobs:
        by_sweep.setdefault(Path(job.run_dir).parent, []).append(job)
    for sweep_dir, runs in by_sweep.items():
        found = status.read(sweep_dir)
        for job in runs:
            packed_state(job, found.of(str(job.slurm_job_id)), found.allocations)


def packed_state(job: JobReport, run: Optional[records.RunState], allocations: Dict[str, str]) -> None:
    """One packed run's report from its records' state (None: no allocation lists it) and Slurm's allocations."""
    job.allocation = str(run.job_id) if run and run.job_id else records.split_packed_id(str(job.slurm_job_id))[0]
    job.slurm_state = run.state if run else None
    if job.status == "COMPLETED":
        return
    if run is None:
        job.status = "FAILED" if _failed_locally(Path(job.run_dir)) else "NOT IN QUEUE"
        return
    job.status = "NO SUMMARY" if run.state == records.COMPLETED else run.state
    if run.state in (records.FAILED, records.CANCELLED):
        job.error = packed_runs.why(Path(job.run_dir), run, allocations.get(job.allocation))
        job.logs = [str(path) for path in packed_runs.logs(Path(job.run_dir), job.allocation)]


def _why(job: JobReport, found: Optional[SlurmState]) -> Optional[str]:
    """The first line of why an ended job did not complete, from its run dir; beside a state Slurm gave, only what
    the run dir recorded (not its NO_RECORD guess)."""
    if found is not None and found.from_run_dir:
        return found.error
    recorded = run_dir_state(Path(job.run_dir))
    return recorded.error if recorded.state != NO_RECORD else None


def failure_lines(jobs: Sequence[JobReport], shown: int = FAILURES_SHOWN) -> List[str]:
    """Why each ended job did not complete, one line each (its run dir's first line of the failure)."""
    failed = [job for job in jobs if job.error]
    if not failed:
        return []
    lines = [f"did not complete ({len(failed):,}):"]
    for job in failed[:shown]:
        if job.allocation:
            lines.append(f"  #{job.name} (allocation {job.allocation}) {job.status}: {job.error}")
            lines += [f"      log: {log}" for log in job.logs]
        else:
            lines.append(f"  #{job.name} {job.slurm_job_id or ''} {job.status}: {job.error}")
    if len(failed) > shown:
        lines.append(f"  ... and {len(failed) - shown:,} more (--json lists every job's error)")
    return lines


# -- the table -------------------------------------------------------------------------------
def state_counts(jobs: Sequence[JobReport]) -> str:
    """How many jobs are in each state, e.g. '2,998 COMPLETED, 1 FAILED' (Slurm's state where it has one)."""
    counts: Dict[str, int] = {}
    for job in jobs:
        state = job.slurm_state or job.status
        counts[state] = counts.get(state, 0) + 1
    return ", ".join(f"{n:,} {state}" for state, n in sorted(counts.items(), key=lambda item: (-item[1], item[0])))


def split_overrides(jobs: Sequence[JobReport]) -> Tuple[List[str], List[List[str]]]:
    """(overrides every job shares, each job's own): a sweep's table shows only what differs."""
    if len(jobs) < 2:
        return [], [list(job.overrides) for job in jobs]
    common = [o for o in jobs[0].overrides if all(o in job.overrides for job in jobs[1:])]
    return common, [[o for o in job.overrides if o not in common] for job in jobs]


def _fmt(value: Any, spec: str) -> str:
    if value is None:
        return "-"
    return format(value, spec) if isinstance(value, (int, float)) and not isinstance(value, bool) else str(value)


def table_rows(jobs: Sequence[JobReport]) -> Tuple[List[str], List[List[str]]]:
    _, own = split_overrides(jobs)
    header = [
        "job",
        "overrides",
        "strategy",
        "layout",
        "world",
        "status",
        "samples/s",
        "train loss",
        "lr",
        "eval acc",
        "attempts",
    ]
    extra = [  # the performance columns some jobs have: (header, value of a job)
        (name, value)
        for name, value, shown in (
            ("tokens/s", lambda job: _fmt(job.tokens_per_sec, ".4g"), any(job.tokens_per_sec for job in jobs)),
            ("MFU", _mfu_cell, any(job.tflops_per_device is not None for job in jobs)),
            ("est. mem", lambda job: _gib(job.estimated_memory_bytes), any(job.estimated_memory_bytes for job in jobs)),
            ("peak mem", lambda job: _gib(job.peak_memory_bytes), any(job.peak_memory_bytes for job in jobs)),
        )
        if shown
    ]
    at = header.index("samples/s") + 1
    header[at:at] = [name for name, _ in extra]
    with_ids = any(job.slurm_job_id for job in jobs)
    packed = any(job.allocation for job in jobs)  # the job column numbers the runs: the allocation's id is enough
    if with_ids:
        header.insert(1, "allocation" if packed else "slurm id")
    rows = []
    for job, overrides in zip(jobs, own):
        row = [
            job.name,
            " ".join(overrides) or "(none)",
            job.strategy or "-",
            job.layout or "-",
            _fmt(job.world_size, "d"),
            job.status,
            _fmt(job.samples_per_sec, ".1f"),
            *(value(job) for _, value in extra),
            _fmt(job.train_loss, ".4f"),
            _fmt(job.lr, ".3g"),
            _fmt(job.eval_accuracy, ".4f"),
            _fmt(job.attempts, "d"),
        ]
        if with_ids:
            row.insert(1, (job.allocation if packed else None) or job.slurm_job_id or "-")
        rows.append(row)
    return header, rows


NUMERIC_COLUMNS = {"world", "samples/s", "tokens/s", "MFU", "peak mem", "train loss", "lr", "eval acc", "attempts"}


def _mfu_cell(job: JobReport) -> str:
    if job.mfu is not None:
        return f"{job.mfu * 100:.1f}%"
    return "n/a" if job.tflops_per_device is not None else "-"


def _gib(count: Optional[int]) -> str:
    return "-" if not count else f"{count / 2**30:.2f}G"


# -- the command -----------------------------------------------------------------------------
def main(argv: Optional[List[str]] = None) -> int:
    args = _parser().parse_args(argv)
    link = remote_report.link_of(args.path)  # a laptop's copy of a cluster's run dir: its records brought up to date
    if link is not None and args.rerun_failed:
        return remote_report.rerun_on_cluster(args.path, link)
    refresh = remote_report.prepare(args.path, link, args.fetch) if link is not None else None
    if args.profile:  # per profiled rank: top operators, where the steps' time went, the slowest rank
        return profile_report.main(args.path, args.json, remote=link is not None)
    if args.rerun_failed:
        return _rerun_failed(args.path)
    if args.watch:
        return _watch(args.path, args.every, refresh)
    if args.path.is_dir() and study_report.is_study(args.path):  # an adaptive sweep: its trials from the journal
        return study_report.main(args.path, args.json)
    if args.path.is_dir() and app_report.is_app_sweep(args.path):  # a Hydra app's jobs: states and return values
        return _app_report(args.path, args.json)
    return _report(args.path, args.json, None if args.no_png else (args.png or (args.path / PNG_NAME)))


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hpc-train-report",
        description=(
            "Summarise a run dir or a multirun sweep dir: a table of every job and a PNG (throughput per job, loss"
            " curves)."
        ),
    )
    parser.add_argument("path", type=Path, help="a run dir (outputs/DATE/TIME) or a sweep dir (multirun/DATE/TIME)")
    parser.add_argument("--png", type=Path, default=None, help=f"where to write the plot (default: PATH/{PNG_NAME})")
    parser.add_argument("--no-png", action="store_true", help="print the table only")
    parser.add_argument(
        "--json", action="store_true", help="print the rows as JSON (exact numbers) instead of the table"
    )
    parser.add_argument(
        "--watch",
        action="store_true",
        help="follow a sweep live (counts by state, running jobs' step/loss/samples/s, failures, ETA) until it ends",
    )
    parser.add_argument("--every", type=float, default=None, help="--watch: seconds between refreshes (default 5)")
    parser.add_argument(
        "--rerun-failed",
        action="store_true",
        help=(
            "resubmit the jobs of a Slurm sweep whose newest attempt failed or was cancelled, as they were submitted"
            " (a packed sweep's runs: together, in one new allocation of the same shape)"
        ),
    )
    parser.add_argument(
        "--fetch",
        action="store_true",
        help="a run dir of a cluster's job, from a laptop: copy all of it here (checkpoints, event files) first",
    )
    parser.add_argument("--profile", action="store_true", help="summarise the run's torch.profiler traces (profile/)")
    return parser


def _rerun_failed(path: Path) -> int:
    count, refusal = rerun_failed(path)
    if refusal:
        print(f"hpc-train-report: {refusal}", file=sys.stderr)
        return 2
    print(f"hpc-train-report: {count} job(s) resubmitted" + ("" if count else ": none failed"))
    return 0


def _watch(path: Path, every: Optional[float], refresh: Any) -> int:
    if not path.is_dir():
        print(f"hpc-train-report: {path} is not a folder: give a sweep dir (multirun/DATE/TIME).", file=sys.stderr)
        return 2
    return watch(path, every or REFRESH_S, refresh=refresh)


def _app_report(path: Path, as_json: bool) -> int:
    found = app_report.rows(path)
    print(json.dumps(found, indent=2) if as_json else app_report.render(path, found))
    return 0 if all(r["state"] == "COMPLETED" for r in found) else 1


def _report(path: Path, as_json: bool, png: Optional[Path]) -> int:
    """The table (or the rows as JSON) of a run or a sweep, then its plot (`png` None: none)."""
    try:
        kind, jobs = collect(path)
    except ReportError as err:
        why = never_running(path) if path.is_dir() else None  # refused before any job folder was made
        print(f"hpc-train-report: {why or err}", file=sys.stderr)
        return 1 if why else 2
    apply_slurm_states(jobs)
    if as_json:
        print(json.dumps([asdict(job) for job in jobs], indent=2))
    else:
        _print_table(path, kind, jobs)
    why = never_running(path) if kind == "sweep" else None
    if why:
        print(f"hpc-train-report: {why}", file=sys.stderr)
    status = 1 if why else 0  # a sweep that will never run is not a success, whatever its table shows
    if png is None:
        return status
    return _plot(jobs, path, png, as_json) or status


def _print_table(path: Path, kind: str, jobs: List[JobReport]) -> None:
    """The table of the jobs, the shared overrides above it, the states, images and failures below it."""
    common, _ = split_overrides(jobs)
    what = f"sweep of {len(jobs)} job{'s' if len(jobs) != 1 else ''}" if kind == "sweep" else "run"
    print(f"hpc-train-report: {path} ({what})")
    if common:
        print(f"overrides shared by every job: {' '.join(common)}")
    print(format_table(*table_rows(jobs), right=NUMERIC_COLUMNS))
    print(
        f"({LAYOUT_LEGEND}; samples/s after the warm-up steps, evaluation excluded; train loss of the last logged step)"
    )
    print(f"states: {state_counts(jobs)}")
    if kind == "run" and jobs[0].performance:
        print(performance.report_lines(jobs[0].performance))
    if kind == "run" and jobs[0].replicas:
        print(jobs[0].replicas)
    for image in sorted({job.image for job in jobs if job.image}):
        print(f"image: {image} ({sum(job.image == image for job in jobs)} of {len(jobs)} jobs)")
    if any(job.state_from_run_dir for job in jobs):
        print(f"({FROM_RUN_DIRS})")
    for line in failure_lines(jobs):
        print(line)


def _plot(jobs: List[JobReport], path: Path, png: Path, as_json: bool) -> int:
    """Write the PNG, or say why not; 0, or the exit code of a record that could not be written."""
    if len(jobs) > PNG_MAX_JOBS:
        print(
            f"hpc-train-report: no plot: {len(jobs):,} jobs are more bars than a chart can show (at most"
            f" {PNG_MAX_JOBS}); use --json for the numbers.",
            file=sys.stderr,
        )
        return 0
    try:
        write_png(jobs, *split_overrides(jobs), str(path), png)
    except ModuleNotFoundError as err:
        if not (err.name or "").startswith("matplotlib"):
            raise
        print(
            f"hpc-train-report: no plot written: matplotlib is not installed. Get it with: {INSTALL_HINT}",
            file=sys.stderr,
        )
        return 0
    except rundir.RecordNotWritten as full:
        print(f"hpc-train-report: no plot written: {full}", file=sys.stderr)
        return rundir.EXIT_REFUSED
    print(f"hpc-train-report: plot written to {png}", file=sys.stderr if as_json else sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
