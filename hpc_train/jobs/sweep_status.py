"""Whether a sweep's launcher is still at work, was refused, or was abandoned (``<sweep dir>/.hpc_train/sweep.json``).

Without it, ``hpc-train-report --watch`` on a sweep that will never run (refused as a whole
before anything was queued, or a local sweep whose launching process was killed) shows its jobs
PENDING for ever. The launchers (hpc-train's sweeps and any Hydra app's,
hpc_train.launch.hydra.sweep and hpc_train.launch.hydra.app_launcher) write ``running`` with their pid and
host when they start a batch of jobs, ``done`` when it has ended (or been queued), ``refused``
with the message when they refuse it; the report and the watch read it (:func:`never_running`).
Both sides use it: no torch here.
"""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path
from typing import Optional

from hpc_train.records import rundir

STATUS = Path(".hpc_train") / "sweep.json"
MULTIRUN = Path("multirun.yaml")  # Hydra's record of the sweep's config (its sweeper writes it)
RUNNING, DONE, REFUSED = "running", "done", "refused"


def _write(sweep_dir: Path, state: str, **extra: object) -> None:
    record = {"state": state, "pid": os.getpid(), "host": socket.gethostname(), "time": time.time(), **extra}
    rundir.write_json_atomic(Path(sweep_dir) / STATUS, record)


def mark_running(sweep_dir: Path) -> None:
    _write(sweep_dir, RUNNING)


def mark_done(sweep_dir: Path) -> None:
    _write(sweep_dir, DONE)


def mark_refused(sweep_dir: Path, message: str) -> None:
    _write(sweep_dir, REFUSED, message=message)


def live_launcher(sweep_dir: Path) -> Optional[dict]:
    """The status of a sweep whose launcher is still at work on this host (its pid alive); None otherwise (no status,
    the launcher done, refused or gone, or on another host, where its pid says nothing)."""
    status = rundir.read_json(Path(sweep_dir) / STATUS)
    if not isinstance(status, dict) or status.get("state") != RUNNING or status.get("host") != socket.gethostname():
        return None
    return status if alive(status.get("pid")) else None


def never_running(sweep_dir: Path) -> Optional[str]:
    """Why the sweep's unfinished jobs will never run, in words; None when they may (or no launcher said)."""
    status = rundir.read_json(Path(sweep_dir) / STATUS)
    if not isinstance(status, dict):
        return None
    if status.get("state") == REFUSED:
        return f"this sweep was refused before anything ran: {status.get('message', '')}".rstrip(": ")
    if status.get("state") == RUNNING and status.get("host") == socket.gethostname() and not alive(status.get("pid")):
        return (
            f"the process that launched this sweep (pid {status.get('pid')} on {status.get('host')}) is gone without"
            " finishing it: its jobs that did not run will not run (run the sweep again; finished jobs are kept)"
        )
    return None


def alive(pid: object) -> bool:
    """Whether process `pid` of this host lives."""
    try:
        os.kill(int(pid), 0)  # type: ignore[arg-type]
    except (ProcessLookupError, ValueError, TypeError):
        return False
    except PermissionError:  # another user's process: alive
        return True
    return True
