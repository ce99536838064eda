"""One run dir, one live job: the claim a job holds on its run dir for as long as it lives (both sides, no torch).

Two jobs writing one run dir interleave their checkpoints, attempts and metrics, and each deletes
what it takes for the other's leftovers. So a launch claims the run dir before it touches
anything: the claim is a small JSON file in the run dir (:data:`CLAIM`), readable from the login
node and every compute node on a shared file system (an ``flock`` is not: some parallel file
systems do not honour it across nodes). It names its holder: a token that travels in the job
spec (so every attempt of a requeued Slurm job knows the claim as its own), the Slurm job id, the
launching process (host, pid and the pid's start time, which pid reuse cannot fake) and rank 0's
process once it runs, and when rank 0 last refreshed it (every :data:`REFRESH_S`).

A claim is live while its holder is: its Slurm job still listed by ``squeue`` (pending, running,
requeued), else its process alive on this host; where neither can be asked (another host, Slurm
not answering), while it was refreshed within :data:`STALE_S`. A live claim refuses a second
launch before it writes a byte; a dead one is taken over with one line saying so.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Mapping, Optional, Tuple

from hpc_train.errors import RunDirRefused
from hpc_train.processes import procfs
from hpc_train.records import rundir
from hpc_train.slurm import slurm_cli

log = logging.getLogger("hpc_train")

CLAIM = ".claim.json"  # in the run dir
REFRESH_S = 30.0  # how often rank 0 refreshes its claim
STALE_S = 300.0  # a claim not refreshed for this long, whose holder cannot be asked, is dead
TOKEN_KEY = "claim"  # the job spec's job.<TOKEN_KEY>: the token of the launch that claimed the run dir


@dataclass
class Claim:
    token: str
    host: str
    pid: int  # the launching process (hpc-train, or rank 0 when nothing claimed before it)
    pid_start: Optional[int]  # its start time in clock ticks after boot (/proc/<pid>/stat): pid reuse shows
    started: float
    refreshed: float
    slurm_job: Optional[str] = None  # the job id as squeue knows it (123 or array task 123_4)
    rank0: Optional[Tuple[str, int, Optional[int]]] = None  # rank 0's (host, pid, pid_start) once it runs
    command: Optional[str] = None  # the command line that started the holder, to start it again (a study's controller)
    how: Optional[str] = None  # how it runs, in words: "in the foreground", "detached, its output in ..."

    def describe(self) -> str:
        who = f"Slurm job {self.slurm_job}" if self.slurm_job else f"pid {self.pid}"
        where = self.rank0[0] if self.rank0 else self.host
        since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.started))
        return f"{who} on {where} (started {since})"


def new_token() -> str:
    return uuid.uuid4().hex


def _start_ticks(pid: int) -> Optional[int]:
    fields = procfs.stat_fields(pid)
    return int(fields[19]) if fields and len(fields) > 19 else None


def _process_alive(host: str, pid: int, pid_start: Optional[int]) -> Optional[bool]:
    """True/False for a process on this host (a zombie is dead); None for one on another host (it cannot be asked
    from here)."""
    if host != socket.gethostname():
        return None
    fields = procfs.stat_fields(pid)
    if not fields or fields[0] == "Z":
        return False
    return pid_start is None or (len(fields) > 19 and int(fields[19]) == pid_start)


def _slurm_job_listed(job: str) -> Optional[bool]:
    """Whether squeue lists the job (pending, running, requeued, completing); None when Slurm does not answer."""
    done = slurm_cli.run(["squeue", "-h", "-r", "-j", job, "-o", "%T"], timeout=15)
    if done.returncode == 0:
        return bool(done.stdout.strip())
    if "Invalid job id" in (done.stderr or ""):  # purged from the controller's memory: long over
        return False
    return None


def liveness(claim: Claim) -> Tuple[bool, str]:
    """(live, why) of a claim, asking Slurm and this host's processes before trusting the refresh time."""
    if claim.slurm_job:
        listed = _slurm_job_listed(claim.slurm_job)
        if listed is not None:
            return listed, f"Slurm job {claim.slurm_job} {'is still queued or running' if listed else 'has ended'}"
    holders = [(claim.host, claim.pid, claim.pid_start)] + ([tuple(claim.rank0)] if claim.rank0 else [])
    answers = [_process_alive(str(h), int(p), s) for h, p, s in holders]  # type: ignore[arg-type]
    if any(answers):
        return True, "its process is alive"
    if answers and all(answer is False for answer in answers) and not claim.slurm_job:
        return False, f"its process (pid {claim.pid} on {claim.host}) is gone"
    age = time.time() - claim.refreshed
    if age < STALE_S:
        return True, f"refreshed {age:.0f} s ago, and its holder cannot be asked from here"
    return False, f"not refreshed for {age:.0f} s (a live holder refreshes it every {REFRESH_S:.0f} s)"


def read(run_dir: Path) -> Optional[Claim]:
    try:
        data = json.loads((Path(run_dir) / CLAIM).read_text())
        rank0 = data.pop("rank0", None)
        return Claim(**data, rank0=tuple(rank0) if rank0 else None)
    except (OSError, ValueError, TypeError):
        return None


def _write(run_dir: Path, claim: Claim) -> None:
    path = Path(run_dir) / CLAIM
    with rundir.recording(path, "nothing was started, and the run dir's records are as they were"):
        rundir.write_json_atomic(path, asdict(claim))


class RunDirBusy(RunDirRefused):
    """The run dir is claimed by a live job; the message names it, its host and the fix."""

    def __init__(self, run_dir: Path, claim: Claim, why: str) -> None:
        self.run_dir, self.claim, self.why = run_dir, claim, why
        fix = f"scancel {claim.slurm_job}" if claim.slurm_job else f"kill {claim.pid} on {claim.host}"
        super().__init__(
            f"run dir {run_dir} is in use by {claim.describe()}: {why}. Two jobs in one run dir would overwrite each"
            f" other's checkpoints. Fix: wait for it to end, stop it ({fix}), or choose another hydra.run.dir."
        )


def check_free(run_dir: Path, token: Optional[str] = None) -> Tuple[Optional[Claim], Optional[str]]:
    """(the claim of another launch, why it is dead) when `run_dir` may be taken; raises RunDirBusy while a live
    job other than `token`'s holds it. Reads only: Hydra's start of a run asks before it writes its own files."""
    current = read(run_dir)
    if current is None or current.token == token:
        return current, None
    live, why = liveness(current)
    if live:
        raise RunDirBusy(run_dir, current, why)
    return current, f"taking over run dir {run_dir} from {current.describe()}: {why}"


def acquire(
    run_dir: Path,
    token: str,
    slurm_job: Optional[str] = None,
    pid: Optional[int] = None,
    command: Optional[str] = None,
    how: Optional[str] = None,
) -> Optional[str]:
    """Claim `run_dir` for the launch `token` (this process, or the child `pid` it started on this host, with the
    `command` and `how` that name it); raises RunDirBusy while a live job holds it.

    Returns the line to say when a dead job's claim was taken over, else None."""
    current, taken_over = check_free(run_dir, token)
    if current is not None and current.token == token:  # our own claim (a requeued job, or the launcher's)
        claim = current
        claim.slurm_job = slurm_job or claim.slurm_job
    else:
        now, pid = time.time(), pid or os.getpid()
        claim = Claim(token, socket.gethostname(), pid, _start_ticks(pid), now, now, slurm_job, None, command, how)
    Path(run_dir).mkdir(parents=True, exist_ok=True)
    _write(run_dir, claim)
    return taken_over


def note_slurm_job(run_dir: Path, token: str, job: str) -> None:
    """After sbatch: the claim names the Slurm job (unless a newer launch took it meanwhile)."""
    claim = read(run_dir)
    if claim is not None and claim.token == token and claim.slurm_job != job:
        claim.slurm_job = job
        _write(run_dir, claim)


def release(run_dir: Path, token: str) -> None:
    """The job ended for good: the run dir is free (a requeued job keeps its claim)."""
    claim = read(run_dir)
    if claim is not None and claim.token == token:
        try:
            (Path(run_dir) / CLAIM).unlink()
        except OSError:
            pass


def rank_token(job: Mapping[str, object], env: Optional[Mapping[str, str]] = None) -> str:
    """The token of the launch this rank belongs to: the job spec's, else its launch's identity (a sweep's job,
    a plain sbatch script, torchrun), the same for every attempt of a Slurm job."""
    env = os.environ if env is None else env
    if job.get(TOKEN_KEY):
        return str(job[TOKEN_KEY])
    slurm = slurm_job_id(env)
    if slurm:
        return f"slurm-{slurm}"
    return f"pid-{socket.gethostname()}-{os.getppid()}"


def slurm_job_id(env: Optional[Mapping[str, str]] = None) -> Optional[str]:
    """This job's id as squeue knows it: ``123`` or, for an array task, ``123_4``."""
    env = os.environ if env is None else env
    if env.get("SLURM_ARRAY_JOB_ID"):
        return f"{env['SLURM_ARRAY_JOB_ID']}_{env.get('SLURM_ARRAY_TASK_ID')}"
    return env.get("SLURM_JOB_ID") or None


class Keeper:
    """Rank 0 refreshes its claim every REFRESH_S while it runs, and names itself in it."""

    def __init__(self, run_dir: Path, token: str) -> None:
        self.run_dir, self.token = run_dir, token
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="run-dir-claim", daemon=True)

    def start(self) -> "Keeper":
        self._refresh()
        self._thread.start()
        return self

    def _refresh(self) -> bool:
        claim = read(self.run_dir)
        if claim is None or claim.token != self.token:
            log.error(
                "this job no longer holds run dir %s (%s): another launch took it over",
                self.run_dir,
                "claim gone" if claim is None else claim.describe(),
            )
            return False
        pid = os.getpid()
        claim.rank0 = (socket.gethostname(), pid, _start_ticks(pid))
        claim.refreshed = time.time()
        _write(self.run_dir, claim)
        return True

    def _run(self) -> None:
        while not self._stop.wait(REFRESH_S):
            try:
                if not self._refresh():
                    return
            except rundir.RecordNotWritten:  # a full disk: the claim as it was, refreshed again next time
                continue

    def stop(self) -> None:
        self._stop.set()
