"""The attempt log: one line per start and per end of a run's attempts (``attempts.jsonl``).

Rank 0 appends ``{"event": "start", ...}`` when an attempt begins and ``{"event": "end",
"how": ...}`` when it ends, where ``how`` is ``finish``, ``timeout``, ``preemption``,
``terminated ...`` or ``crash``. An attempt killed outright (SIGKILL, node failure, out of
memory) leaves a start without an end; the next attempt reports it. ``resume=never`` starts
a new count.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import time
from pathlib import Path
from typing import Any, Dict, List

log = logging.getLogger("hpc_train")
FILE_NAME = "attempts.jsonl"


def read(run_dir: Path) -> List[Dict[str, Any]]:
    """The records of the current count (after the last fresh start)."""
    path = Path(run_dir) / FILE_NAME
    if not path.exists():
        return []
    records = []
    for line in path.read_text().splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:  # a line torn by a kill: ignore it
            continue
    starts = [i for i, r in enumerate(records) if r.get("event") == "start" and r.get("fresh")]
    return records[starts[-1]:] if starts else records


def count(run_dir: Path) -> int:
    """How many attempts this run has started so far."""
    return sum(1 for r in read(run_dir) if r.get("event") == "start")


def _append(run_dir: Path, record: Dict[str, Any]) -> None:
    with open(Path(run_dir) / FILE_NAME, "a") as handle:
        handle.write(json.dumps(record) + "\n")
        handle.flush()
        os.fsync(handle.fileno())


def begin(run_dir: Path, fresh: bool, resumed_from_step: Any) -> int:
    """Record the start of an attempt (rank 0); report how earlier ones ended. Returns its number."""
    previous = [] if fresh else read(run_dir)
    ended = {r.get("attempt") for r in previous if r.get("event") == "end"}
    for record in previous:
        if record.get("event") == "start":
            how = next((r.get("how") for r in previous if r.get("event") == "end" and r.get("attempt") == record.get("attempt")), None)
            if record.get("attempt") not in ended:
                how = "killed without a word (SIGKILL, node failure or out of memory)"
            log.info("attempt %s (job %s) ended: %s", record.get("attempt"), record.get("job_id") or "local", how)
    number = sum(1 for r in previous if r.get("event") == "start") + 1
    _append(run_dir, {
        "event": "start", "attempt": number, "fresh": fresh, "time": time.time(), "host": socket.gethostname(),
        "job_id": os.environ.get("SLURM_JOB_ID"), "resumed_from_step": resumed_from_step,
    })
    return number


def end(run_dir: Path, attempt: int, how: str, step: int) -> None:
    _append(run_dir, {"event": "end", "attempt": attempt, "how": how, "step": step, "time": time.time()})
    log.info("attempt %d ended: %s (at step %d)", attempt, how, step)
