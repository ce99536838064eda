"""What state a job is in, read from what it left and from Slurm: one set of readers for every caller.

``hpc_train.Job.state()``, ``hpc-train-report`` and ``hpc-train-report --watch`` all read job
states here. Slurm states come from one ``squeue`` call and one ``sacct`` call per batch of
array ids (a 3,000-job sweep in 3 arrays asks about 3 ids, not 3,000 jobs); a local job's from
its process and run dir. States are Slurm's names for both (PENDING, RUNNING, COMPLETED,
FAILED, CANCELLED, TIMEOUT, ...).
"""

from __future__ import annotations

import math
import re
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Iterable, List, Optional, Tuple

from hpc_train import rundir
from hpc_train import slurm_cli
from hpc_train.rank_errors import read_records, root_cause

EXIT_STOPPED = rundir.EXIT_INTERRUPTED  # stopped by a signal after a checkpoint
ENDED = frozenset(
    {
        "COMPLETED",
        "FAILED",
        "CANCELLED",
        "TIMEOUT",
        "NODE_FAIL",
        "OUT_OF_MEMORY",
        "PREEMPTED",
        "BOOT_FAIL",
        "DEADLINE",
        "REVOKED",
    }
)


def rank_error(run_dir: Path, since: float) -> Tuple[Optional[int], Optional[str]]:
    """(rank, one-line error) of the rank that failed first, from logs/rank<r>.error.json written after `since`."""
    log_dir = run_dir / rundir.LOGS
    ranks = [
        int(m.group(1))
        for m in (re.fullmatch(r"rank(\d+)\.error\.json", p.name) for p in log_dir.glob("rank*.error.json"))
        if m
    ]
    records = read_records(run_dir, max(ranks) + 1, since) if ranks else {}
    if not records:
        return None, None
    rank, record = root_cause([], records)
    return rank, str(record["error"]) if record else None


def read_summary(run_dir: Path) -> Optional[Dict[str, Any]]:
    return rundir.read_summary(run_dir)


def stopped(code: Optional[int]) -> bool:
    return code in (EXIT_STOPPED, 130, -signal.SIGINT, -signal.SIGTERM)


def state_of_exit(code: Optional[int], has_summary: bool) -> str:
    if code == 0:
        return "COMPLETED"
    if code is None:
        return "COMPLETED" if has_summary else "UNKNOWN"
    return "CANCELLED" if stopped(code) else "FAILED"


# -- Slurm states ----------------------------------------------------------------------------
def _expand_array(job_id: str) -> List[str]:
    """``123_[0-2,5]`` -> 123_0, 123_1, 123_2, 123_5 (sacct/squeue print pending arrays that way)."""
    match = re.fullmatch(r"(\d+)_\[([\d,\-%]+)\]", job_id)
    if not match:
        return [job_id]
    base, spec = match.group(1), match.group(2).split("%")[0]
    ids = []
    for part in spec.split(","):
        if "-" in part:
            lo, hi = part.split("-")
            ids.extend(f"{base}_{i}" for i in range(int(lo), int(hi) + 1))
        elif part:
            ids.append(f"{base}_{part}")
    return ids


def _parse_states(text: str, sep: str) -> Dict[str, str]:
    states: Dict[str, str] = {}
    for line in text.splitlines():
        if sep not in line:
            continue
        job_id, state = line.split(sep, 1)
        state = state.split()[0] if state.split() else ""
        for one in _expand_array(job_id.strip()):
            states.setdefault(one, state)
    return states


IDS_PER_CALL = 200  # job/array ids per squeue or sacct call (argument lists stay short)


@dataclass(frozen=True)
class SlurmState:
    state: str  # Slurm's name: PENDING, RUNNING, COMPLETED, FAILED, ...
    elapsed_s: Optional[int] = None  # sacct's Elapsed (run time so far, or in all once ended)


def _batches(items: List[str], size: int = IDS_PER_CALL) -> Iterable[List[str]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


def slurm_job_states(job_ids: Iterable[str]) -> Dict[str, SlurmState]:
    """The state of each job id (``123`` or array task ``123_7``), asked per array, not per job.

    sacct (with accounting) knows every job, live or ended, with its run time: one call per
    IDS_PER_CALL arrays. Jobs it does not know yet (just queued, or no accounting) are read
    from squeue, also by array id. Missing from the result: neither knows the job.
    """
    wanted = sorted({str(j) for j in job_ids if j})
    found: Dict[str, SlurmState] = {}
    bases = sorted({j.split("_")[0] for j in wanted})
    for batch in _batches(bases):
        for fields in slurm_cli.sacct_runs(batch, "JobID,State,ElapsedRaw"):
            if len(fields) < 2 or not fields[1].split():
                continue
            elapsed = int(fields[2]) if len(fields) > 2 and fields[2].isdigit() else None
            for one in _expand_array(fields[0]):
                found.setdefault(one, SlurmState(fields[1].split()[0], elapsed))
    rest = sorted({j.split("_")[0] for j in wanted if j not in found})
    for batch in _batches(rest):
        text = slurm_cli.query(["squeue", "-h", "-r", "-o", "%i|%T", "-j", ",".join(batch)])
        for job_id, state in _parse_states(text or "", "|").items():
            found.setdefault(job_id, SlurmState(state))
    return {j: found[j] for j in wanted if j in found}


def slurm_states(job_ids: Iterable[str]) -> Dict[str, str]:
    """The state name of each job id (see slurm_job_states)."""
    return {job_id: found.state for job_id, found in slurm_job_states(job_ids).items()}


class SharedStates:
    """Slurm states of a sweep's jobs, read for all of them at once and kept for `max_age_s`.

    ``hpc_train.sweep`` hands one to every Job of a Slurm sweep: asking each of 3,000 jobs for
    its state costs one sacct call per refresh, not 3,000.
    """

    def __init__(self, job_ids: Iterable[str], max_age_s: float = 1.0) -> None:
        self.job_ids = [str(j) for j in job_ids]
        self.max_age_s = max_age_s
        self._read_at = -math.inf
        self._states: Dict[str, str] = {}

    def get(self, job_id: str) -> Optional[str]:
        if time.monotonic() - self._read_at > self.max_age_s:
            self._states = slurm_states(self.job_ids)
            self._read_at = time.monotonic()
        return self._states.get(str(job_id))
