"""hpc-train-report for a Hydra app's sweep (hydra/launcher=hpc_train_slurm): each job's state and return value.

An app's jobs have no summary.json or metrics of hpc-train's; what they give back is their task
function's return value, which submitit keeps in ``<folder>/<job id>_result.pkl`` (the folder
is in ``.hpc_train/submissions.jsonl``). With ``hydra.launcher.wait=false`` this is where the
results of a sweep are read once it has run. A Slurm job's state is Slurm's; a local job's
(``hpc_train_local``, its id a process id) is its result file's: COMPLETED or FAILED once written,
RUNNING while its process lives, FAILED when the process is gone without one (killed). A packed job's
(``hydra.launcher.pack``, its id ``<allocation>:<run>``) is its allocation's records' (hpc_train.pack.status),
its return value the JobReturn its job step left (hpc_train.pack.app_step). No torch here.
"""

from __future__ import annotations

import json
import pickle
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from hpc_train.jobs import job_table
from hpc_train.jobs.job_states import slurm_job_states
from hpc_train.jobs.submissions import SUBMISSIONS, submissions
from hpc_train.jobs.sweep_status import alive
from hpc_train.jobs.text_table import format_table
from hpc_train.pack import app_step, records, status
from hpc_train.report import packed_runs

APP_TASK_GLOB = "app_task_*.pkl"  # what hpc_train.launch.hydra.app_launcher leaves in <sweep dir>/.hpc_train


def is_app_sweep(sweep_dir: Path) -> bool:
    return any((Path(sweep_dir) / SUBMISSIONS).parent.glob(APP_TASK_GLOB))


def is_local_app_sweep(sweep_dir: Path) -> bool:
    """A Hydra app's sweep run by hpc_train_local (its jobs are processes of this host, not Slurm jobs).

    One launcher submits a sweep's jobs, so its first submission record says (--watch asks at every refresh:
    the whole file of a 10,000-job Slurm sweep is not read for it)."""
    if not is_app_sweep(sweep_dir):
        return False
    try:
        with (Path(sweep_dir) / SUBMISSIONS).open() as handle:
            first = handle.readline()
    except OSError:
        return False
    return bool(first.strip()) and bool(json.loads(first).get("local"))


def _result(folder: Path, job_id: str) -> Tuple[Optional[str], Optional[str]]:
    """(COMPLETED or FAILED as the job's result file says, None before it has ended; its return value or its
    error's last line, in words)."""
    from submitit.core.utils import JobPaths  # submitit (~50 ms): only a Hydra app's sweep needs it, not every report

    path = JobPaths(folder, job_id=job_id).result_pickle  # submitit's own naming (%j and array ids resolved)
    try:
        outcome, value = pickle.loads(path.read_bytes())
    except FileNotFoundError:
        return None, None
    except Exception as err:  # noqa: BLE001 - a value of a class this process cannot import
        return None, f"(unreadable: {type(err).__name__})"
    if outcome != "success":
        lines = [line for line in str(value).splitlines() if line.strip()]
        return "FAILED", f"error: {lines[-1].strip() if lines else value}"
    ret = getattr(value, "_return_value", value)  # a JobReturn, as the launcher's task returns
    return "COMPLETED", repr(ret)[:80]


def _local_state(ended: Optional[str], pid: str) -> Tuple[str, Optional[str]]:
    """A local job's state (see the module's docstring), and a note when its process died without a result."""
    if ended is not None:
        return ended, None
    if alive(pid):
        return "RUNNING", None
    return "FAILED", "ended without a result (killed?)"


def rows(sweep_dir: Path) -> List[Dict[str, Any]]:
    """One row per job (its newest attempt): number, job id, overrides, layout, state, result, stderr log."""
    from submitit.core.utils import JobPaths  # submitit (~50 ms): only a Hydra app's sweep needs it, not every report

    table = {number: (row.job_id, row.overrides, row.layout) for number, row in job_table.newest(sweep_dir).items()}
    entries = submissions(sweep_dir)
    local = {job_id for job_id, entry in entries.items() if entry.get("local")}
    packed = {job_id for job_id, _, _ in table.values() if records.is_packed_id(job_id)}
    states = slurm_job_states(job_id for job_id, _, _ in table.values() if job_id not in local | packed)
    pool = status.read(sweep_dir) if packed else None
    out = []
    for number, (job_id, overrides, layout) in sorted(table.items(), key=lambda item: int(item[0])):
        if pool is not None and job_id in packed:
            state, result, log = packed_row(sweep_dir, number, pool.of(job_id))
            row = {"job": number, "job_id": job_id, "overrides": overrides, "layout": layout, "state": state}
            out.append({**row, "result": result, "log": log})
            continue
        entry = entries.get(job_id)
        ended, result = _result(Path(entry["folder"]), job_id) if entry else (None, None)
        if job_id in local:
            state, note = _local_state(ended, job_id)
            result = result or note
        else:
            slurm = states.get(job_id)
            state = slurm.state if slurm else "UNKNOWN"
        log = str(JobPaths(Path(entry["folder"]), job_id=job_id).stderr) if entry else None
        out.append(
            {
                "job": number,
                "job_id": job_id,
                "overrides": overrides,
                "layout": layout,
                "state": state,
                "result": result,
                "log": log,
            }
        )
    return out


def packed_row(
    sweep_dir: Path, number: str, run: Optional[records.RunState]
) -> Tuple[str, Optional[str], Optional[str]]:
    """(state, result, stderr log) of a packed job: its records' state; the value its JobReturn holds, or its error
    (why it left none, once it ended without completing)."""
    folder = app_step.run_folder(sweep_dir, number)
    logs = packed_runs.step_logs(folder, run.job_id if run else None)
    log = str(logs[0]) if logs else (run.srun_log or None) if run else None  # srun's own, when its step was refused
    state = run.state if run else "UNKNOWN"
    returned = packed_runs.job_return(folder) if state in records.ENDED_STATES else None
    if returned is not None:
        return state, returned[1], log
    ended = run is not None and state in (records.FAILED, records.CANCELLED)
    return state, packed_runs.why(folder, run) if ended else None, log


def render(sweep_dir: Path, found: List[Dict[str, Any]]) -> str:
    header = ("job", "job id", "overrides", "state", "result")
    cells = [
        (r["job"], r["job_id"], r["overrides"], r["state"], r["result"] if r["result"] is not None else "-")
        for r in found
    ]
    lines = [f"hpc-train-report: {sweep_dir} (a Hydra app's sweep of {len(found)} job{'s' if len(found) != 1 else ''})"]
    lines.append(format_table(header, cells))
    counts: Dict[str, int] = {}
    for r in found:
        counts[r["state"]] = counts.get(r["state"], 0) + 1
    lines.append("states: " + ", ".join(f"{n} {state}" for state, n in sorted(counts.items())))
    return "\n".join(lines)
