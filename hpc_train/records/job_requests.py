"""What a rank asks of its job's outer process on the batch host, as data in one file.

The ranks may run inside a container without Slurm's commands, so they never call ``scontrol`` themselves: the
rank that decides (rank 0 after a stop signal's checkpoint, the watching rank after a hang, the first rank that
finds its image unusable) writes one request, atomically, to the file the batch host names in
``HPC_TRAIN_REQUESTS``; the batch host (hpc_train.batchhost.agent) reads it once the job step has ended and acts:
``scontrol requeue`` (and ``ExcNodeList`` for a hang's nodes), or the image's refusal as the job's last line.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

from hpc_train.records import rundir

REQUESTS_VARIABLE = "HPC_TRAIN_REQUESTS"
REQUEUE, REFUSE = "requeue", "refuse"


def request_file() -> Optional[Path]:
    """Where this rank's requests go (None: no outer process listens; a local run or a packed run's step)."""
    value = os.environ.get(REQUESTS_VARIABLE)
    return Path(value) if value else None


def write(action: str, exclude: Optional[List[str]] = None, message: str = "", why: str = "") -> bool:
    """Ask the batch host to act once the step ends; False when nothing listens."""
    path = request_file()
    if path is None:
        return False
    record: Dict[str, Any] = {"action": action, "exclude": list(exclude or []), "message": message, "why": why}
    rundir.write_json_atomic(path, record)
    return True


def mark_started() -> None:
    """The first thing a rank does in its image: say that the image's Python ran (see ``started``)."""
    path = request_file()
    if path is not None:
        started_file(path).touch()


def started_file(path: Path) -> Path:
    return path.with_name(path.name.replace(".json", "") + ".started")


def read(path: Path) -> Optional[Dict[str, Any]]:
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) and record.get("action") in (REQUEUE, REFUSE) else None


def wait_for(timeout_s: float) -> bool:
    """A rank other than the deciding one: wait until the request is written (its own exit must not end the step
    before the deciding rank has written it); True once it is there."""
    path = request_file()
    deadline = time.monotonic() + timeout_s
    while path is not None and time.monotonic() < deadline:
        if path.exists():
            return True
        time.sleep(0.2)
    return False
