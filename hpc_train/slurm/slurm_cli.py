"""Slurm's commands (sacct, squeue, scontrol, sinfo, scancel) run from Python, in one place.

How they are called (output captured as text, a timeout, never raising for a missing command
or a failure) and what the callers get back: ``query`` the output of a command that succeeded,
else None (the caller decides what "no answer" means: accounting off, not a Slurm machine);
``run`` the finished process, for callers that report Slurm's own words on failure. Inside
``hosts.commands_on(cluster)`` (a laptop following a cluster's jobs) they run on the cluster's login node over SSH. The
parsers several callers share live here too. Both sides import it: no torch.

A ``SLURM_CONF`` that names no file is refused here, before any command runs: Slurm's client
retries such a file for 60 s before it gives up, and every caller would wait that long for
nothing. Any other missing configuration the client refuses itself within milliseconds (see
``config_problem``).
"""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import signal
import subprocess
import time
from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple, TypeVar

from hpc_train.hosts import hosts

TIMEOUT_S = 60.0  # a busy controller answers within this; every call has a timeout (a hung slurmctld never hangs us)
REMEMBER_S = 60.0  # how long a process keeps the cluster's answer to a question it asks once per command
_T = TypeVar("_T")
_REMEMBERED: List[Dict[str, Tuple[float, Any]]] = []


def remembered(ask: Callable[[], _T]) -> Callable[[], _T]:
    """The cluster's answer to ``ask()`` (a question without arguments: its configuration, its nodes) kept for
    REMEMBER_S seconds in this process: a command or a sweep asks once, a process that lives longer (a notebook's
    kernel, the Python API, a session whose cluster was reconfigured) asks again once the answer is older."""
    kept: Dict[str, Tuple[float, Any]] = {}
    _REMEMBERED.append(kept)

    @functools.wraps(ask)
    def answer() -> _T:
        now = time.monotonic()
        if "answer" not in kept or now - kept["answer"][0] > REMEMBER_S:
            kept["answer"] = (now, ask())
        return kept["answer"][1]

    return answer


def forget_answers() -> None:
    """Every remembered answer dropped: the next question asks the cluster (after the cluster itself changed)."""
    for kept in _REMEMBERED:
        kept.clear()


def run(
    command: Sequence[str], timeout: float = TIMEOUT_S, env: Optional[Dict[str, str]] = None, hold_sigterm: bool = False
) -> subprocess.CompletedProcess:
    """The command, finished; a missing command or a timeout is a failed process (exit 127 / 124, why in stderr).

    hold_sigterm: the command starts with SIGTERM blocked. For a command run from inside a Slurm job that requeues the
    job, or that follows such a command: Slurm then sends SIGTERM to every process of the job, the command included,
    which could die before it exits with Slurm's answer (a requeue done would read as failed, and what follows it
    would not be done). SIGKILL still comes KillWait later.
    """
    args = [str(word) for word in command]
    # Here, or on a cluster's login node over SSH (a laptop following a cluster's jobs); a failure is returned.
    host = hosts.current() or hosts.LOCAL
    problem = config_problem(env) if host is hosts.LOCAL and shutil.which(args[0]) else None
    if problem:
        return subprocess.CompletedProcess(args, 1, "", f"{args[0]} was not run: {problem}")
    with _sigterm_blocked(hold_sigterm):  # a child starts with its parent thread's signal mask
        return host.run(args, timeout, env, text=True, failure=hosts.RETURN)


@contextlib.contextmanager
def _sigterm_blocked(block: bool) -> Iterator[None]:
    """SIGTERM blocked in this thread inside the block (the process's other threads still take it)."""
    if not block:
        yield
        return
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def query(command: Sequence[str], timeout: float = TIMEOUT_S, env: Optional[Dict[str, str]] = None) -> Optional[str]:
    """The command's output when it succeeded; None when it is missing, failed or did not answer in time."""
    done = run(command, timeout, env)
    return done.stdout if done.returncode == 0 else None


def said(done: subprocess.CompletedProcess) -> str:
    """What a failed command said, in one line: its fatal line (Slurm's reason comes last, after its attempts), else
    the first line of its stderr, else of its stdout, else its exit status."""
    text = (done.stderr or "").strip() or (done.stdout or "").strip() or f"exit status {done.returncode}"
    lines = text.splitlines()
    return next((line for line in reversed(lines) if " fatal: " in line), lines[0])


# Slurm 22.05's last words when it reads no slurm.conf ("Unable to process configuration file", "Could not establish a
# configuration source"); config_problem's own words say "configuration file" too.
_NO_CONFIG_WORDS = ("configuration file", "configuration source")


def config_problem(env: Optional[Mapping[str, str]] = None) -> Optional[str]:
    """Why Slurm's commands would read no configuration, told without running one; None when they may read one.

    Only a SLURM_CONF naming no file is told here, as the client would wait on it. Without SLURM_CONF the client
    itself looks for its default slurm.conf and, when there is none, asks configless sources (slurmd's cache,
    SLURM_CONF_SERVER, DNS SRV records): that works on a configless login node and fails at once elsewhere, so it is
    left to the client.
    """
    path = (os.environ if env is None else env).get("SLURM_CONF")
    if path is None or os.path.exists(path):
        return None
    return f"SLURM_CONF={path or repr(path)} names no configuration file"


def unconfigured(done: subprocess.CompletedProcess) -> bool:
    """Whether a failed command failed for want of a Slurm configuration (not a slow or unreachable controller)."""
    return done.returncode != 0 and any(words in said(done) for words in _NO_CONFIG_WORDS)


def show_job(job: str, timeout: float = TIMEOUT_S) -> Dict[str, str]:
    """``scontrol show job -o JOB`` as {field: value}; {} when Slurm does not answer."""
    fields: Dict[str, str] = {}
    for word in (query(["scontrol", "show", "job", "-o", job], timeout) or "").split():
        name, sep, value = word.partition("=")
        if sep:
            fields.setdefault(name, value)
    return fields


def sacct_runs(job_ids: List[str], fields: str, timeout: float = TIMEOUT_S, every_run: bool = False) -> List[List[str]]:
    """``sacct -n -X -P -o FIELDS -j IDS`` (``-D``: every run of a requeued job) as rows of fields, times as epoch
    seconds; [] when accounting does not answer."""
    return sacct_answer(job_ids, fields, timeout, every_run) or []


def sacct_steps(job_id: str, fields: str, timeout: float = TIMEOUT_S) -> Optional[List[List[str]]]:
    """``sacct -n -P -o FIELDS -j JOB``: the job and each of its steps (``JOB.0``, ``JOB.batch``, ...) as rows of
    fields; None when accounting does not answer (off, closed to users, down)."""
    text = query(["sacct", "-n", "-P", "-j", job_id, "-o", fields], timeout)
    return None if text is None else [line.strip().split("|") for line in text.splitlines() if line.strip()]


def sacct_answer(
    job_ids: List[str], fields: str, timeout: float = TIMEOUT_S, every_run: bool = False
) -> Optional[List[List[str]]]:
    """sacct_runs, but None when accounting does not answer (off, closed to users, down): a caller that must tell
    "no such job" from "nobody to ask" (the job states) reads this."""
    if not job_ids:
        return []
    command = ["sacct", "-n", "-X", "-P", *(["-D"] if every_run else []), "-j", ",".join(job_ids), "-o", fields]
    text = query(command, timeout, env=dict(os.environ, SLURM_TIME_FORMAT="%s"))
    return None if text is None else [line.strip().split("|") for line in text.splitlines() if line.strip()]
