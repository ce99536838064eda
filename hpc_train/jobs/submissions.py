"""Each Slurm job's submission record, for a rerun and the reports.

At submission every Slurm job of a sweep (hpc-train's own or a Hydra app's) leaves one line in
``<sweep dir>/.hpc_train/submissions.jsonl``: its Slurm id, job number, submitit folder, sbatch
parameters and requeue budget. ``hpc-train-report --rerun-failed`` resubmits from it
(hpc_train.launch.backends.rerun). No torch here: a login node reads it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict, List, Optional

from hpc_train.records import rundir

SUBMISSIONS = Path(".hpc_train") / "submissions.jsonl"


def record(sweep_dir: Path, entries: List[Dict[str, Any]]) -> None:
    """Append one line per submitted job: {job_id, job, folder, params, max_requeues}."""
    path = Path(sweep_dir) / SUBMISSIONS
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as handle:
        for entry in entries:
            handle.write(json.dumps(entry, default=str) + "\n")


def newest_submission(folder: Path) -> Optional[Dict[str, Any]]:
    """The newest submission record of a sweep dir or of a single run's dir (None when nothing was submitted)."""
    path = Path(folder) / SUBMISSIONS
    entries = rundir.read_jsonl(path) if path.exists() else []
    return entries[-1] if entries else None


def submissions(sweep_dir: Path) -> Dict[str, Dict[str, Any]]:
    """job id -> its submission record (the newest one of a job id, were it recorded twice)."""
    path = Path(sweep_dir) / SUBMISSIONS
    if not path.exists():
        return {}
    return {str(entry["job_id"]): entry for entry in rundir.read_jsonl(path)}
