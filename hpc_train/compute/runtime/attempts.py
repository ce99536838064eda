"""The attempt log: one line per start and per end of a run's attempts (``attempts.jsonl``).

Rank 0 appends ``{"event": "start", ...}`` when an attempt begins and ``{"event": "end",
"how": ...}`` when it ends, where ``how`` is ``finish``, ``timeout``, ``preemption``,
``terminated ...`` or ``crash``. An attempt killed outright (SIGKILL, node failure, out of
memory) leaves a start without an end; the next attempt reports it. Under Slurm the next
attempt also asks ``sacct`` how the earlier runs of the job ended when rank 0 could not know
(no end, a SIGTERM, a crash): a node failure sends SIGTERM to the surviving ranks, so only
Slurm can tell it from ``scancel``. Its answer is appended as a later end record of that
attempt (``"source": "slurm"``), which supersedes the earlier one. ``resume=never`` starts a
new count.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

from hpc_train.containers.inside import image_record
from hpc_train.records import rundir
from hpc_train.records.metrics_log import LAUNCH_ID_VARIABLE
from hpc_train.slurm import slurm_cli

log = logging.getLogger("hpc_train")
FROM_SLURM = "slurm"  # an end record's source when Slurm's accounting said how the attempt ended


def _append(run_dir: Path, record: Dict[str, Any]) -> None:
    path = Path(run_dir) / rundir.ATTEMPTS
    with rundir.recording(path, "the earlier attempts' records are kept whole, and the checkpoints with them"):
        rundir.append_line_durable(path, json.dumps(record))


KILLED = "killed without a word (SIGKILL, node failure or out of memory)"
# Slurm's end states that say more than a silence or a SIGTERM can.
SLURM_ENDINGS = {
    "NODE_FAIL": "node failure",
    "BOOT_FAIL": "node failure",
    "OUT_OF_MEMORY": "out of memory",
    "PREEMPTED": "preemption",
    "TIMEOUT": "timeout",
    "DEADLINE": "timeout",
}


def slurm_endings(job_ids: List[str]) -> List[Dict[str, Any]]:
    """Every run of these Slurm jobs, requeued ones included (``sacct -D``): job id, state, start and end (epoch s)."""
    runs = []
    for fields in slurm_cli.sacct_runs(job_ids, "JobIDRaw,State,Start,End", timeout=20, every_run=True):
        if len(fields) == 4 and fields[2].isdigit() and fields[3].isdigit():
            runs.append(
                {
                    "job_id": fields[0],
                    "state": fields[1].split()[0] if fields[1] else "",
                    "start": int(fields[2]),
                    "end": int(fields[3]),
                }
            )
    return runs


def _slurm_how(record: Dict[str, Any], runs: List[Dict[str, Any]]) -> Optional[str]:
    """What Slurm says ended the run this attempt started in, when that says more than rank 0 knew."""
    for run in runs:
        if run["job_id"] == record.get("job_id") and run["start"] - 1 <= float(record.get("time", 0)) <= run["end"] + 1:
            meaning = SLURM_ENDINGS.get(run["state"])
            return f"{meaning} (Slurm: {run['state']})" if meaning else None
    return None


def _unsure(how: Optional[str]) -> bool:
    """Endings rank 0 records when it cannot know the cause: nothing, a SIGTERM, or a crash."""
    return how is None or how == "crash" or how.startswith("terminated")


def begin(run_dir: Path, fresh: bool, resumed_from_step: Any, key: Optional[str] = None) -> int:
    """Record the start of an attempt (rank 0); report how earlier ones ended. Returns its number.

    `key` names the attempt for tasks that count attempts themselves (a script job's, see
    hpc_train.compute.entry.script_job.attempt_number)."""
    previous = [] if fresh else rundir.read_attempts(run_dir)
    ends: Dict[Any, Dict[str, Any]] = {}
    for r in previous:
        if r.get("event") == "end":
            ends[r.get("attempt")] = r  # the last end record of an attempt wins (Slurm's word comes later)
    starts = [r for r in previous if r.get("event") == "start"]
    asked = [
        r
        for r in starts
        if r.get("job_id")
        and ends.get(r.get("attempt"), {}).get("source") != FROM_SLURM
        and _unsure(ends.get(r.get("attempt"), {}).get("how"))
    ]
    runs = slurm_endings(sorted({str(r["job_id"]) for r in asked}))
    for record in starts:
        end_record = ends.get(record.get("attempt"))
        how = end_record.get("how") if end_record else None
        said = _slurm_how(record, runs) if record in asked else None
        if said:
            _append(
                run_dir,
                {
                    "event": "end",
                    "attempt": record.get("attempt"),
                    "how": said,
                    "step": (end_record or {}).get("step"),
                    "time": time.time(),
                    "source": FROM_SLURM,
                },
            )
            how = said if how is None else f"{said}; rank 0 saw: {how}"
        log.info("attempt %s (job %s) ended: %s", record.get("attempt"), record.get("job_id") or "local", how or KILLED)
    number = len(starts) + 1
    _append(
        run_dir,
        {
            "event": "start",
            "attempt": number,
            "fresh": fresh,
            "time": time.time(),
            "host": socket.gethostname(),
            "job_id": os.environ.get("SLURM_JOB_ID"),
            "python": image_record(),
            "resumed_from_step": resumed_from_step,
            **({"key": key} if key is not None else {}),
        },
    )
    return number


def end(run_dir: Path, attempt: int, how: str, step: int, detail: Optional[str] = None) -> None:
    _append(
        run_dir,
        {
            "event": "end",
            "attempt": attempt,
            "how": how,
            "step": step,
            "time": time.time(),
            **({"detail": detail} if detail else {}),
        },
    )
    log.info("attempt %d ended: %s (at step %d)", attempt, how, step)


def current(run_dir: Path) -> int:
    """The number of the attempt that started last (0 before any): for code that ends an attempt it did not begin."""
    starts = [r for r in rundir.read_attempts(run_dir) if r.get("event") == "start"]
    return int(starts[-1].get("attempt") or 0) if starts else 0


def end_current(run_dir: Path, how: str, step: int, detail: Optional[str] = None) -> None:
    end(run_dir, current(run_dir), how, step, detail)


def attempt_key() -> str:
    """What names this attempt on every task alike: the Slurm job and its restart count, else the local launch."""
    job = os.environ.get("SLURM_JOB_ID")
    if job:
        return f"slurm:{job}:{os.environ.get('SLURM_RESTART_COUNT', '0')}"
    return f"local:{os.environ.get(LAUNCH_ID_VARIABLE) or os.getppid()}"
