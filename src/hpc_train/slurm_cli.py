"""Slurm's commands (sacct, squeue, scontrol, sinfo, scancel) run from Python, in one place.

How they are called (output captured as text, a timeout, never raising for a missing command
or a failure) and what the callers get back: ``query`` the output of a command that succeeded,
else None (the caller decides what "no answer" means: accounting off, not a Slurm machine);
``run`` the finished process, for callers that report Slurm's own words on failure. The
parsers several callers share live here too. Both sides import it: no torch.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from typing import Dict, List, Optional, Sequence

TIMEOUT_S = 60.0  # a busy controller answers within this; every call has a timeout (a hung slurmctld never hangs us)


def run(command: Sequence[str], timeout: float = TIMEOUT_S, env: Optional[Dict[str, str]] = None) -> subprocess.CompletedProcess:
    """The command, finished; a missing command or a timeout is a failed process (exit 127 / 124, why in stderr)."""
    args = [str(word) for word in command]
    if shutil.which(args[0]) is None:
        return subprocess.CompletedProcess(args, 127, "", f"{args[0]}: command not found")
    try:
        return subprocess.run(args, capture_output=True, text=True, timeout=timeout, check=False, env=env)
    except subprocess.TimeoutExpired:
        return subprocess.CompletedProcess(args, 124, "", f"{args[0]} did not answer within {timeout:g} s")
    except OSError as err:
        return subprocess.CompletedProcess(args, 126, "", f"{args[0]}: {err}")


def query(command: Sequence[str], timeout: float = TIMEOUT_S, env: Optional[Dict[str, str]] = None) -> Optional[str]:
    """The command's output when it succeeded; None when it is missing, failed or did not answer in time."""
    done = run(command, timeout, env)
    return done.stdout if done.returncode == 0 else None


def said(done: subprocess.CompletedProcess) -> str:
    """What a failed command said, in one line (its stderr, else stdout, else its exit status)."""
    text = (done.stderr or "").strip() or (done.stdout or "").strip() or f"exit status {done.returncode}"
    return text.splitlines()[0]


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
