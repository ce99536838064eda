"""The run directory's contract, written once: file names, exit codes, atomic writes, resume targets, attempts.

The launcher, every rank and ``hpc-train-report`` read and write run dirs only through this
module (no torch here: the login node uses it too)::

    <run dir>/
      job_config.yaml              the resolved job spec every rank runs (launcher)
      summary.json                 rank 0, at the end of training
      metrics.jsonl                rank 0, one line per logged step and per evaluation
      attempts.jsonl               rank 0, start and end of every attempt
      checkpoints/step_<N>.ckpt    rank 0, the newest `trainer.keep_checkpoints`
      checkpoints/step_<N>/        the same for fsdp: a torch.distributed.checkpoint directory, every rank's shard
      model.pt | model_stage<s>.pt final weights
      logs/rank<r>.log             every rank; rank<r>.error.json (a failing rank), rank<r>.out (local ranks > 0)
      logs/rank<r>.progress.json   every rank, every heartbeat: step, phase, last advance (hpc_train.records.hang)
      logs/hang.json               the hang watchdog's request to every rank, then its verdict
      slurm/                       submitit's scripts and logs
    <sweep dir>/jobs.tsv           the sweep launcher's job table (Slurm sweeps)
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import secrets
import shutil
import socket
import time
from pathlib import Path
from typing import Any, BinaryIO, Callable, Dict, Iterator, List, Optional

from hpc_train.errors import DiskFull

JOB_CONFIG = "job_config.yaml"
SUMMARY = "summary.json"
# The memory check's estimate, written at launch (hpc_train.launch.planning.memory_check.Fit.record); summary.json
# holds it under the same name, beside the measured peak (records.performance.MEMORY).
MEMORY_ESTIMATE = "memory_estimate.json"
METRICS = "metrics.jsonl"
ATTEMPTS = "attempts.jsonl"
CHECKPOINTS = "checkpoints"
LOGS = "logs"
SLURM_LOGS = "slurm"
WEIGHTS = "model.pt"
SHARDED_MANIFEST = "manifest.json"  # written last into a sharded (fsdp) checkpoint dir: its files and fingerprint
JOB_TABLE = "jobs.tsv"
HYDRA_OVERRIDES = ".hydra/overrides.yaml"
REMOTE_LINK = "remote.json"  # a laptop's run (or sweep) dir: where its copy on the cluster is (hpc_train.remote)
LAYOUT_CHOICE = "layout_choice.json"  # strategy=auto: the layouts it ranked and why it ran the one it did

# How a rank (python -m hpc_train.compute.worker) and the hpc-train command exit.
EXIT_OK = 0
EXIT_FAILED = 1  # an exception: the traceback is in logs/rank<r>.log
EXIT_REFUSED = 2  # bad input, one message and no traceback (the CLI uses it for config errors too)
EXIT_INTERRUPTED = (
    3  # stopped by a signal, after a checkpoint (a second signal: at once): run the same command to resume
)
EXIT_HUNG = 4  # the hang watchdog stopped the job: no rank advanced for trainer.hang_timeout_s (hpc_train.records.hang)
EXIT_UNREACHABLE = 5  # the login side could not reach the cluster (hpc_train.errors.Unreachable): nothing is wrong
# with the config; the same command may work once the connection does. No rank ever exits with it.
EXIT_CTRL_C = 130  # 128 + SIGINT, as a shell reports Ctrl-C: a third one killed the ranks, or one stopped the queueing
# The file into which the hpc-train command writes its refusal (EXIT_REFUSED, EXIT_UNREACHABLE) as data (its family,
# key, problem and fix: hpc_train.launch.hydra.exits), named
# by its caller in this variable: the Python API (hpc_train.launch.hydra.cli_child), a laptop's forwarded command
# (hpc_train.remote.serve). The caller reads that, never the words printed for a person.
CLI_RESULT_VARIABLE = "HPC_TRAIN_CLI_RESULT"

# How a job stopped before its end goes on from its last checkpoint, in the words of where it ran: the job spec's
# job.sweep (hpc_train.launch.planning.jobspec) is None for a run; for a sweep's job, its sweep dir and how the
# sweep's jobs run again: RERUN_FAILED where Slurm ran them (arrays or packed runs: the rerun resubmits only what did
# not complete), RERUN_SWEEP where they ran one by one on this machine (no job table to rerun from). See resume_hint.
RERUN_FAILED = "failed jobs"
RERUN_SWEEP = "sweep"
RESUME_HINTS: Dict[Optional[str], str] = {
    None: "run the same command again (same hydra.run.dir={run_dir}) to resume from the last checkpoint",
    RERUN_FAILED: "rerun the sweep's jobs that did not complete with: hpc-train-report {sweep_dir} --rerun-failed"
    " (each resumes from its last checkpoint)",
    RERUN_SWEEP: "run the sweep's command again with hydra.sweep.dir={sweep_dir} to resume its jobs from their last"
    " checkpoints (its finished jobs are left as they are)",
}

# hpc-train's closing line for each way a job ends, one table for every launcher (local, torchrun, a followed Slurm
# job): see closing_line. EXIT_REFUSED has two: a rank refused before this launch trained a step, or later.
REFUSED_MID_RUN = "refused mid-run"
CLOSING_LINES: Dict[Any, str] = {
    EXIT_INTERRUPTED: "stopped by a signal (after a checkpoint, unless a second signal stopped it at once); {resume}",
    EXIT_HUNG: "the job hung and its watchdog stopped it (exit code {code}): the stuck ranks and their stacks are named"
    " above and in {logs}; {resume}",
    EXIT_REFUSED: "the job refused to start (exit code {code}): the reason is printed above and in {logs}",
    REFUSED_MID_RUN: "the job stopped mid-run at step {step}: a rank refused to go on (exit code {code}); the reason is"
    " printed above and in {logs}. Fix it, then {resume}",
    EXIT_FAILED: "the job failed (exit code {code}); see the logs in {logs}",
}

RESUME_WORDS = ("auto", "never")
_CHECKPOINT = re.compile(r"^step_(\d+)(?:\.ckpt)?$")  # a file (step_<N>.ckpt) or a sharded directory (step_<N>/)


# -- names ------------------------------------------------------------------------------------
def stage_weights(stage: int) -> str:
    return f"model_stage{stage}.pt"


def rank_log(run_dir: Path, rank: int) -> Path:
    return Path(run_dir) / LOGS / f"rank{rank}.log"


def rank_error(run_dir: Path, rank: int) -> Path:
    return Path(run_dir) / LOGS / f"rank{rank}.error.json"


_RANK_ERROR = re.compile(r"^rank(\d+)\.error\.json$")  # rank_error's name


def ranks_with_error_files(run_dir: Path) -> List[int]:
    """The ranks whose rank_error file is in the run dir (of any attempt), in order."""
    paths = (Path(run_dir) / LOGS).glob("rank*.error.json")
    return sorted(int(found.group(1)) for path in paths if (found := _RANK_ERROR.match(path.name)))


def rank_progress(run_dir: Path, rank: int) -> Path:
    return Path(run_dir) / LOGS / f"rank{rank}.progress.json"


def hang_file(run_dir: Path) -> Path:
    return Path(run_dir) / LOGS / "hang.json"


def rank_output(run_dir: Path, rank: int) -> Path:
    return Path(run_dir) / LOGS / f"rank{rank}.out"


def checkpoint_dir(run_dir: Path) -> Path:
    return Path(run_dir) / CHECKPOINTS


def step_name(global_step: int) -> str:
    """``step_<N>`` (9 digits): a sharded checkpoint's directory; a file checkpoint adds ``.ckpt``."""
    return f"step_{global_step:09d}"


def checkpoint_path(run_dir: Path, global_step: int, sharded: bool = False) -> Path:
    """checkpoints/step_<N>.ckpt, or the directory checkpoints/step_<N>/ of a sharded (fsdp) checkpoint."""
    return checkpoint_dir(run_dir) / (step_name(global_step) if sharded else f"{step_name(global_step)}.ckpt")


def checkpoint_step(path: Path) -> Optional[int]:
    """The step of a checkpoint file or directory named by step_name (with or without .ckpt); None for any other."""
    found = _CHECKPOINT.match(Path(path).name)
    return int(found.group(1)) if found else None


def is_checkpoint(path: Path) -> bool:
    """A checkpoint file, or a sharded checkpoint's directory (with the manifest its save writes last), by any name."""
    path = Path(path)
    return path.is_file() or (path / SHARDED_MANIFEST).is_file()


def list_checkpoints(folder: Path) -> List[Path]:
    """Checkpoints (files and sharded directories) in `folder`, newest (highest step) first."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in folder.iterdir() if (m := _CHECKPOINT.match(p.name)) and is_checkpoint(p)]
    return [p for _, p in sorted(found, reverse=True)]


_TEMPORARY = re.compile(r"^\.step_.*\.tmp")  # .step_<N>.ckpt.tmp<pid> files, .step_<N>.dcp.tmp* dirs


def remove_stale_temporaries(folder: Path) -> List[Path]:
    """Delete what interrupted checkpoint writes left in `folder`; returns what was removed.

    Only while no write is running: at the start of an attempt (rank 0), or by the writer itself.
    """
    folder = Path(folder)
    if not folder.is_dir():
        return []
    removed = []
    for path in sorted(folder.iterdir()):
        if not _TEMPORARY.match(path.name):
            continue
        remove_path(path)
        removed.append(path)
    return removed


def remove_path(path: Path) -> None:
    """A file, or a directory with everything in it (a link is removed, not followed); gone already is fine."""
    path = Path(path)
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        try:
            path.unlink()
        except FileNotFoundError:
            pass


def is_run_dir(path: Path) -> bool:
    return any((Path(path) / name).exists() for name in (SUMMARY, JOB_CONFIG, METRICS, HYDRA_OVERRIDES))


# -- atomic writes ------------------------------------------------------------------------------
def fsync_path(path: Path) -> None:
    """fsync a file or a folder, best effort (a rename survives a power cut only once its folder is synced)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def temporary_name(path: Path) -> Path:
    """A name beside `path` that no other writer takes, on any node and in any container (whose first process is
    pid 1 on every node): a hidden ``.NAME.tmp<host>.<pid>.<random>``."""
    path = Path(path)
    return path.with_name(f".{path.name}.tmp{socket.gethostname()}.{os.getpid()}.{secrets.token_hex(4)}")


def write_atomic(
    path: Path,
    write: Callable[[BinaryIO], None],
    before: Optional[Callable[[str], None]] = None,
    durable: bool = True,
    make_folder: bool = True,
) -> None:
    """`write` into a temporary file beside `path`, flush, fsync, rename, fsync the folder: never a torn file under
    `path`; the temporary file is removed when any of it fails. The one atomic writer of hpc_train: every record,
    small or streamed (`write` gets the open file), takes this way or :func:`replace_atomic`.

    The file gets the mode a plain ``open(path, "w")`` gives (0666 less the umask). `durable=False` skips both fsyncs
    (a record rewritten every heartbeat, whose loss the next one repairs); `make_folder=False` writes nothing when
    the folder is gone (FileNotFoundError) instead of making it again. `before` is called with ``"fsync"`` and
    ``"rename"`` just before each (a test hook that injects a failure there)."""
    path = Path(path)
    if make_folder:
        path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temporary_name(path)
    hook = before or (lambda point: None)
    try:
        with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666), "wb") as handle:
            write(handle)
            handle.flush()
            hook("fsync")
            if durable:
                os.fsync(handle.fileno())
        hook("rename")
        replace_atomic(tmp, path, durable)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def replace_atomic(source: Path, path: Path, durable: bool = True) -> None:
    """`source` (a finished file, a link, a folder) renamed to `path` in one step, replacing a file or link there;
    then, `durable`, the folder fsynced. hpc_train's one rename of a record (write_atomic's last step; the checkpoint
    directories' own are in compute/checkpointing/dcp_dirs.py). A folder onto a non-empty one raises OSError."""
    os.replace(source, path)
    if durable:
        fsync_path(Path(path).parent)


def link_atomic(path: Path, points_at: str) -> None:
    """The symbolic link `path` -> `points_at`, replacing what is there in one step (made beside it, then renamed)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temporary_name(path)
    tmp.symlink_to(points_at)
    try:
        replace_atomic(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_bytes_atomic(
    data: bytes,
    path: Path,
    halfway: Optional[Callable[[], None]] = None,
    durable: bool = True,
    make_folder: bool = True,
) -> None:
    """`data` under `path`, atomically (write_atomic, with its `durable` and `make_folder`). `halfway` runs between the
    two halves of the write (a test hook that widens the window in which a kill can hit mid-write)."""
    view = memoryview(data)  # its slices copy nothing

    def write(handle: BinaryIO) -> None:
        half = view.nbytes // 2
        handle.write(view[:half])
        if halfway is not None:
            halfway()
        handle.write(view[half:])

    write_atomic(path, write, durable=durable, make_folder=make_folder)


# -- a full disk while writing a record -----------------------------------------------------------
DISK_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)  # no space left, or the user's quota reached
FREE_AND_RERUN = "free space on that file system (old runs' checkpoints, quota), then run the same command again"


class RecordNotWritten(DiskFull):
    """A run's or a sweep's record that a full disk (or a quota) kept from being written: ``str(err)`` is the one
    message (which file, what was kept, the fix); the command stops with EXIT_REFUSED, no traceback."""

    on_console = False  # as a rank's Refusal: set once rank 0's log put the message on the console


def no_space_message(path: Path, kept: str, fix: str = FREE_AND_RERUN) -> str:
    path = Path(path)
    return f"no space left to write {path.name} in {path.parent}: {kept}. Fix: {fix}."


@contextlib.contextmanager
def recording(path: Path, kept: str, fix: str = FREE_AND_RERUN) -> Iterator[None]:
    """Around the write of the record `path`: a full disk (ENOSPC, EDQUOT) becomes :class:`RecordNotWritten`,
    naming the file and what was `kept`; any other error passes unchanged."""
    try:
        yield
    except OSError as err:
        if err.errno not in DISK_FULL_ERRNOS:
            raise
        raise RecordNotWritten(no_space_message(path, kept, fix)) from None


def append_whole(path: Path, text: str, durable: bool = False) -> None:
    """`text` (whole lines) appended to `path`, or nothing: a write cut short (a full disk) is cut off again, so the
    file never ends in half a line that the next append would glue to its own. `durable`: fsynced too."""
    data = memoryview(text.encode())
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
    try:
        size = os.fstat(fd).st_size
        try:
            while data:  # a write may take part of it, and the next one fail
                data = data[os.write(fd, data) :]
            if durable:
                os.fsync(fd)
        except OSError:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, size)
            raise
    finally:
        os.close(fd)


def write_durable(path: Path, data: bytes) -> None:
    """`data` written in place, flushed and fsynced: for the files of a temporary folder that is renamed whole."""
    with open(path, "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())


def append_line_durable(path: Path, line: str) -> None:
    """One line appended and fsynced (a record that must survive the process being killed right after), whole or not
    at all (append_whole)."""
    append_whole(path, line + "\n", durable=True)


def write_text_atomic(path: Path, text: str, durable: bool = True, make_folder: bool = True) -> None:
    write_bytes_atomic(text.encode(), path, durable=durable, make_folder=make_folder)


def write_json_atomic(path: Path, data: Any) -> None:
    """JSON that readers never see half-written."""
    write_text_atomic(path, json.dumps(data, indent=2))


def write_summary(run_dir: Path, summary: Dict[str, Any]) -> None:
    """summary.json, atomically: a full disk keeps the previous one (a resumed run's) and says so. The memory check's
    estimate, where the launch wrote one, goes in beside the measured peak."""
    path = Path(run_dir) / SUMMARY
    estimate = read_json(Path(run_dir) / MEMORY_ESTIMATE)
    if isinstance(estimate, dict):
        summary = {**summary, MEMORY_ESTIMATE.removesuffix(".json"): estimate}
    kept = "training ran to its end; the checkpoints and metrics are kept, and the previous summary.json (if any)"
    with recording(path, kept, FREE_AND_RERUN + " to write it from the last checkpoint"):
        write_json_atomic(path, summary)


def read_json(path: Path) -> Optional[Any]:
    """The JSON in `path`, or None when it is missing or unreadable."""
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None


def read_summary(run_dir: Path) -> Optional[Dict[str, Any]]:
    summary = read_json(Path(run_dir) / SUMMARY)
    return summary if isinstance(summary, dict) else None


def read_jsonl(path: Path) -> List[Dict[str, Any]]:
    """Every whole JSON line of `path` (a line torn by a kill is skipped)."""
    try:
        lines = Path(path).read_text().splitlines()
    except OSError:
        return []
    records = []
    for line in lines:
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict):
            records.append(record)
    return records


# -- what a run resumes from --------------------------------------------------------------------
def resume_target(resume: str, run_dir: Path) -> Optional[Path]:
    """Where `resume` points: a checkpoint file or a folder of checkpoints; None for resume=never.

    ``auto`` is this run dir's checkpoints; a run dir means its checkpoints/ folder; a folder
    without one is taken as a folder of checkpoints; anything else is a file path.
    """
    resume = str(resume)
    if resume == "never":
        return None
    if resume == "auto":
        return checkpoint_dir(run_dir)
    target = Path(resume).expanduser()
    if target.is_dir() and checkpoint_dir(target).is_dir():
        return checkpoint_dir(target)
    return target  # a checkpoint (file or sharded directory), or a folder of checkpoints


def newest_checkpoint(resume: str, run_dir: Path) -> Optional[Path]:
    """The newest checkpoint file `resume` names (unverified), or None when there is none."""
    target = resume_target(resume, run_dir)
    if target is None:
        return None
    if is_checkpoint(target):
        return target
    if target.is_dir():
        files = list_checkpoints(target)
        return files[0] if files else None
    return None


# -- the attempt log ----------------------------------------------------------------------------
def read_attempts(run_dir: Path) -> List[Dict[str, Any]]:
    """The attempt records of the current count: everything after the last fresh start."""
    records = read_jsonl(Path(run_dir) / ATTEMPTS)
    fresh = [i for i, r in enumerate(records) if r.get("event") == "start" and r.get("fresh")]
    return records[fresh[-1] :] if fresh else records


def attempts_started(run_dir: Path, since: float = 0.0) -> int:
    """How many attempts this run has started so far (0: none, or no attempt log); `since` (a time.time()): only
    those started after it (this launch's, see launched_at)."""
    return sum(1 for r in read_attempts(run_dir) if r.get("event") == "start" and float(r.get("time", 0)) >= since)


def launched_at(run_dir: Path) -> float:
    """When the launch now in this run dir wrote its job spec (every launcher writes it before its ranks start, or as
    soon as sbatch returned): the attempts recorded after it are this launch's."""
    try:
        return (Path(run_dir) / JOB_CONFIG).stat().st_mtime
    except OSError:
        return time.time()


def steps_trained_to(run_dir: Path, since: float) -> Optional[int]:
    """The step the last attempt started after `since` (a time.time()) ended at, when it trained past where it began;
    None when no attempt started since, it recorded no end, or it ended where it began (nothing trained).

    Rank 0 records an attempt's start (with resumed_from_step) once training is set up and its end with the step
    reached, whatever ends it: this tells a refusal mid-run from one at the start."""
    records = read_attempts(run_dir)
    starts = [r for r in records if r.get("event") == "start" and float(r.get("time", 0)) >= since]
    if not starts:
        return None
    start = starts[-1]
    ends = [r for r in records if r.get("event") == "end" and r.get("attempt") == start.get("attempt")]
    step = ends[-1].get("step") if ends else None
    if not isinstance(step, int) or step <= int(start.get("resumed_from_step") or 0):
        return None
    return step


def closing_line(code: int, run_dir: Path, since: float = 0.0) -> str:
    """hpc-train's last line for a job that ended with `code` without a summary, from CLOSING_LINES; a refusal names
    the step reached when the attempt started after `since` had trained past its start."""
    step = steps_trained_to(run_dir, since) if code == EXIT_REFUSED else None
    key = REFUSED_MID_RUN if step is not None else (code if code in CLOSING_LINES else EXIT_FAILED)
    resume = resume_hint(run_dir) if "{resume}" in CLOSING_LINES[key] else ""
    words = CLOSING_LINES[key].format(logs=Path(run_dir) / LOGS, code=code, step=step, resume=resume)
    return f"hpc-train: {words}"


def resume_hint(run_dir: Path) -> str:
    """How this run goes on from its last checkpoint, for where it ran (RESUME_HINTS): its job spec's job.sweep."""
    sweep = job_sweep(run_dir)
    if sweep is None:
        return RESUME_HINTS[None].format(run_dir=run_dir)
    return RESUME_HINTS[sweep["rerun"]].format(sweep_dir=sweep["dir"])


def job_sweep(run_dir: Path) -> Optional[Dict[str, str]]:
    """The job spec's job.sweep ({dir, rerun}) of the run in `run_dir`; None for a run of its own (or no spec)."""
    import yaml  # on use: most readers of the run dir never need it

    try:
        spec = yaml.load((Path(run_dir) / JOB_CONFIG).read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    except (OSError, yaml.YAMLError):
        return None
    sweep = spec.get("job", {}).get("sweep") if isinstance(spec, dict) else None
    return sweep if isinstance(sweep, dict) and sweep.get("rerun") in RESUME_HINTS else None
