"""A packed run that did not complete, read from its own run dir: why, in one line, and which logs say more.

A packed run's logs are its own: ``<run>/logs/rank<r>.error.json`` (a rank's failure, its traceback in
``rank<r>.log``), its job step's ``<run>/slurm/<allocation>_<step>_<task>_log.err``, and srun's own words about its
steps (Slurm's refusal of one) in ``<run>/slurm/<allocation>_srun.err``. The allocation's own
``<sweep>/.hpc_train/pack/<id>.err`` holds the pool's lines, shared by every run it started: never the place
to look for one run's failure. ``hpc-train-report`` and ``--watch`` print them. A Hydra app's packed run
(hpc_train.pack.app_step) says how it ended in the JobReturn its step leaves in its run folder. No torch here.
"""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import List, Optional, Tuple

from hpc_train.jobs.job_states import first_rank_error
from hpc_train.pack import app_step, records
from hpc_train.pack.records import RunState
from hpc_train.records import rundir


def step_logs(run_dir: Path, allocation_job_id: Optional[str]) -> List[Path]:
    """The stderr files of the run's job steps in that allocation, newest first (a requeued allocation's too)."""
    if not allocation_job_id:
        return []
    found = (Path(run_dir) / rundir.SLURM_LOGS).glob(f"{allocation_job_id}_*_log.err")
    return sorted(found, key=lambda path: (_mtime(path), path.name), reverse=True)


def error_records(run_dir: Path) -> List[Path]:
    return sorted((Path(run_dir) / rundir.LOGS).glob("rank*.error.json"))


def logs(run_dir: Path, allocation_job_id: Optional[str]) -> List[Path]:
    """Where to read why the run failed: its ranks' error records, then its job step's stderr, then srun's own
    (Slurm's refusal of the step, when it wrote one)."""
    srun = [records.srun_log_path(run_dir, allocation_job_id)] if allocation_job_id else []
    return error_records(run_dir) + step_logs(run_dir, allocation_job_id)[:1] + [p for p in srun if _size(p)]


def why(run_dir: Path, run: RunState, allocation_state: Optional[str] = None) -> str:
    """The first line of why the run did not complete: its first failing rank's error (this attempt's), else its
    step's stderr, else what the records say (the step's exit code, or its allocation's end)."""
    error = first_rank_error(Path(run_dir), run.started or 0.0)[1]
    if error:
        return error
    returned = job_return(Path(run_dir))
    if returned is not None and returned[0] == records.FAILED:
        return returned[1]
    if run.state == records.CANCELLED:
        said = f" (Slurm: {allocation_state})" if allocation_state else ""
        return f"its allocation {run.job_id} ended{said} before it finished"
    refused = records.refusal(run)
    if refused:
        return refused
    for path in step_logs(run_dir, run.job_id)[:1]:
        said = _said(path)
        if said:
            return said
    return f"its job step exited with code {run.exit_code}" if run.exit_code is not None else "no error recorded"


def job_return(folder: Path) -> Optional[Tuple[str, str]]:
    """A Hydra app's packed run: (COMPLETED or FAILED, its return value or its error's last line) from the
    JobReturn its step left in its run folder; None without one."""
    try:
        ret = pickle.loads((Path(folder) / app_step.RETURN_FILE).read_bytes())  # cloudpickle's, which pickle reads
    except FileNotFoundError:
        return None
    except Exception as err:  # noqa: BLE001 - a value of a class this process cannot import
        return records.FAILED, f"(unreadable: {type(err).__name__})"
    value = getattr(ret, "_return_value", None)
    if getattr(getattr(ret, "status", None), "name", "") == "COMPLETED":
        return records.COMPLETED, repr(value)[:80]
    lines = [line for line in str(value).splitlines() if line.strip()]
    return records.FAILED, f"error: {lines[-1].strip() if lines else value}"


def _said(path: Path) -> Optional[str]:
    try:
        lines = [line.strip() for line in path.read_text(errors="replace").splitlines() if line.strip()]
    except OSError:
        return None
    return next((line for line in lines if "Error" in line or "error" in line), lines[-1] if lines else None)


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0
