"""What state a job is in, read from what it left and from Slurm: one set of readers for every caller.

``hpc_train.Job.state()``, ``hpc-train-report`` and ``hpc-train-report --watch`` all read job
states here. Slurm states come from one ``squeue`` call and one ``sacct`` call per batch of
array ids (a 3,000-job sweep in 3 arrays asks about 3 ids, not 3,000 jobs); a local job's from
its process and run dir. States are Slurm's names for both (PENDING, RUNNING, COMPLETED,
FAILED, CANCELLED, TIMEOUT, ...).

Where Slurm's accounting does not answer (``sacct`` off, or not open to users), squeue still
tells the live jobs, and a job it no longer lists gets the state its run dir records
(:func:`run_dir_state`): summary.json, the end of its last attempt in attempts.jsonl, its ranks'
error records. One that recorded nothing is NO_RECORD, never a guess.
"""

from __future__ import annotations

import math
import re
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Iterable, List, Mapping, Optional, Set, Tuple

from hpc_train.records import rundir
from hpc_train.records.rank_errors import read_records, root_cause
from hpc_train.slurm import slurm_cli

EXIT_STOPPED = rundir.EXIT_INTERRUPTED  # stopped by a signal after a checkpoint
# Not in squeue, no accounting to ask, and its run dir does not say how it ended: it never started (cancelled while
# pending) or was killed without a word (SIGKILL, node failure, out of memory).
NO_RECORD = "ENDED (no record)"
FROM_RUN_DIRS = (
    "Slurm's accounting (sacct) did not answer: the states of jobs squeue no longer lists come from their run dirs"
    " (summary.json, attempts.jsonl, logs/rank<r>.error.json)"
)
ENDED = frozenset(
    {
        NO_RECORD,
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


def first_rank_error(run_dir: Path, since: float) -> Tuple[Optional[int], Optional[str]]:
    """(rank, one-line error) of the rank that failed first, from the failure records written after `since`."""
    ranks = rundir.ranks_with_error_files(run_dir)
    records = read_records(run_dir, ranks[-1] + 1, since) if ranks else {}
    if not records:
        return None, None
    rank, record = root_cause([], records)
    return rank, str(record["error"]) if record else None


def read_summary(run_dir: Path) -> Optional[Dict[str, Any]]:
    return rundir.read_summary(run_dir)


def stopped(code: Optional[int]) -> bool:
    return code in (EXIT_STOPPED, rundir.EXIT_CTRL_C, -signal.SIGINT, -signal.SIGTERM)


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
    error: Optional[str] = None  # from the run dir: the failure's first line (or why NO_RECORD)
    from_run_dir: bool = False  # accounting did not answer: the run dir's records, not Slurm, say this


# How an attempt ended (attempts.jsonl's "how", by its first word) in Slurm's words; "... (Slurm: STATE)" says it.
_ENDINGS = {
    "finish": "COMPLETED",
    "crash": "FAILED",
    "hang": "FAILED",
    "timeout": "TIMEOUT",
    "preemption": "PREEMPTED",
    "terminated": "CANCELLED",
    "stop": "CANCELLED",
    "stopped": "CANCELLED",
}
_SLURM_SAID = re.compile(r"\(Slurm: (\w+)\)")


def _ending(how: str) -> str:
    said = _SLURM_SAID.search(how)
    return said.group(1) if said else _ENDINGS.get(how.split(" ", 1)[0], "FAILED")


def run_dir_state(run_dir: Path) -> SlurmState:
    """How a job that squeue no longer lists ended, from its run dir alone (for when accounting does not answer).

    The same records for hpc_train's own jobs and script jobs: a summary is COMPLETED; the last attempt's end
    record says how it ended (a script's failure leaves only its ranks' error records, which make it FAILED);
    an attempt that started and recorded no end, or no attempt at all, is NO_RECORD.
    """
    if rundir.read_summary(run_dir) is not None:
        return SlurmState("COMPLETED", from_run_dir=True)
    records = rundir.read_attempts(run_dir)
    starts = [i for i, r in enumerate(records) if r.get("event") == "start"]
    last = starts[-1] if starts else 0
    ends = [r for r in records[last:] if r.get("event") == "end"] if starts else []
    # errors of this attempt: written after the previous attempt's end (a rank may fail before rank 0 records a start)
    since = max((float(r.get("time", 0)) for r in records[:last] if r.get("event") == "end"), default=0.0)
    error = first_rank_error(run_dir, since)[1]
    if ends:
        how = str(ends[-1].get("how") or "")
        state = _ending(how)
        if state != "FAILED":
            return SlurmState(state, error=error if state != "COMPLETED" else None, from_run_dir=True)
        detail = str(ends[-1].get("detail") or "").strip().splitlines()
        return SlurmState(state, error=error or (detail[0] if detail else how), from_run_dir=True)
    if error:
        return SlurmState("FAILED", error=error, from_run_dir=True)
    if starts:
        start = records[last]
        why = f"attempt {start.get('attempt')} started on {start.get('host')} and recorded no end (killed outright?)"
        return SlurmState(NO_RECORD, error=why, from_run_dir=True)
    return SlurmState(NO_RECORD, error="it never started (nothing in its run dir)", from_run_dir=True)


def _batches(items: List[str], size: int = IDS_PER_CALL) -> Iterable[List[str]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


def _squeue(batch: List[str]) -> Optional[Dict[str, str]]:
    """squeue's states of these jobs (live ones: squeue lists no ended job); None when squeue did not answer."""
    done = slurm_cli.run(["squeue", "-h", "-r", "-o", "%i|%T", "-j", ",".join(batch)])
    if done.returncode == 0:
        return _parse_states(done.stdout, "|")
    return {} if "Invalid job id" in (done.stderr or "") else None  # every id of the batch is gone: an answer


def slurm_job_states(job_ids: Iterable[str], run_dirs: Optional[Mapping[str, Path]] = None) -> Dict[str, SlurmState]:
    """The state of each job id (``123`` or array task ``123_7``), asked per array, not per job.

    sacct (with accounting) knows every job, live or ended, with its run time: one call per
    IDS_PER_CALL arrays. Jobs it does not know yet (just queued, or no accounting) are read
    from squeue, also by array id. When sacct did not answer, a job of `run_dirs` (job id ->
    run dir) that squeue no longer lists gets its run dir's state (run_dir_state). Missing
    from the result: nobody knows the job.
    """
    wanted = sorted({str(j) for j in job_ids if j})
    found: Dict[str, SlurmState] = {}
    silent: Set[str] = set()  # arrays sacct did not answer for
    bases = sorted({j.split("_")[0] for j in wanted})
    for batch in _batches(bases):
        rows = slurm_cli.sacct_answer(batch, "JobID,State,ElapsedRaw")
        if rows is None:
            silent.update(batch)
        for fields in rows or []:
            if len(fields) < 2 or not fields[1].split():
                continue
            elapsed = int(fields[2]) if len(fields) > 2 and fields[2].isdigit() else None
            for one in _expand_array(fields[0]):  # a later row of the same job is newer: a job that lost a node
                found[one] = SlurmState(fields[1].split()[0], elapsed)  # (--no-kill) has a RESIZING row, then its own
    rest = sorted({j.split("_")[0] for j in wanted if j not in found})
    for batch in _batches(rest):
        listed = _squeue(batch)
        for job_id, state in (listed or {}).items():
            found.setdefault(job_id, SlurmState(state))
        if listed is None or not run_dirs:
            continue  # squeue did not answer either: a job it might list is not taken for ended
        gone = set(batch) & silent
        for job_id in wanted:
            if job_id not in found and job_id.split("_")[0] in gone and job_id in run_dirs:
                found[job_id] = run_dir_state(Path(run_dirs[job_id]))
    return {j: found[j] for j in wanted if j in found}


def queue_states(job_ids: Iterable[str]) -> Dict[str, str]:
    """squeue's word alone on these jobs (the live ones): where sacct's may lag behind, a job that has just started
    still PENDING in accounting. Missing: squeue does not list the job (ended), or did not answer."""
    found: Dict[str, str] = {}
    for batch in _batches(sorted({str(j) for j in job_ids if j})):
        found.update(_squeue(batch) or {})
    return found


def slurm_states(job_ids: Iterable[str], run_dirs: Optional[Mapping[str, Path]] = None) -> Dict[str, str]:
    """The state name of each job id (see slurm_job_states)."""
    return {job_id: found.state for job_id, found in slurm_job_states(job_ids, run_dirs).items()}


class SharedStates:
    """Slurm states of a sweep's jobs, read for all of them at once and kept for `max_age_s`.

    ``hpc_train.sweep`` hands one to every Job of a Slurm sweep: asking each of 3,000 jobs for
    its state costs one sacct call per refresh, not 3,000.
    """

    def __init__(
        self, job_ids: Iterable[str], max_age_s: float = 1.0, run_dirs: Optional[Mapping[str, Path]] = None
    ) -> None:
        self.job_ids = [str(j) for j in job_ids]
        self.max_age_s = max_age_s
        self.run_dirs = run_dirs  # job id -> run dir: the states of ended jobs when accounting does not answer
        self._read_at = -math.inf
        self._states: Dict[str, str] = {}

    def get(self, job_id: str) -> Optional[str]:
        if time.monotonic() - self._read_at > self.max_age_s:
            self._states = slurm_states(self.job_ids, self.run_dirs)
            self._read_at = time.monotonic()
        return self._states.get(str(job_id))
