"""hpc-train-report for a Hydra app's sweep (hydra/launcher=hpc_train_slurm): each job's state and return value.

An app's jobs have no summary.json or metrics of hpc-train's; what they give back is their task
function's return value, which submitit keeps in ``<folder>/<job id>_result.pkl`` (the folder
is in ``.hpc_train/submissions.jsonl``). With ``hydra.launcher.wait=false`` this is where the
results of a sweep are read once it has run. No torch here.
"""

from __future__ import annotations

import json
import pickle
from pathlib import Path
from typing import Any, Dict, List, Optional

from hpc_train.launch.rerun import SUBMISSIONS, newest_rows

APP_TASK_GLOB = "app_task_*.pkl"  # what hpc_train.launch.app_launcher leaves in <sweep dir>/.hpc_train


def is_app_sweep(sweep_dir: Path) -> bool:
    return any((Path(sweep_dir) / SUBMISSIONS).parent.glob(APP_TASK_GLOB))


def _result(folder: Path, job_id: str) -> Optional[str]:
    """The job's return value (or its error's last line), in words; None before it has ended."""
    from submitit.core.utils import JobPaths

    path = JobPaths(folder, job_id=job_id).result_pickle  # submitit's own naming (%j and array ids resolved)
    try:
        outcome, value = pickle.loads(path.read_bytes())
    except FileNotFoundError:
        return None
    except Exception as err:  # noqa: BLE001 - a value of a class this process cannot import
        return f"(unreadable: {type(err).__name__})"
    if outcome != "success":
        lines = [line for line in str(value).splitlines() if line.strip()]
        return f"error: {lines[-1].strip() if lines else value}"
    ret = getattr(value, "_return_value", value)  # a JobReturn, as the launcher's task returns
    return repr(ret)[:80]


def rows(sweep_dir: Path) -> List[Dict[str, Any]]:
    from hpc_train.job_states import slurm_job_states

    table = newest_rows(sweep_dir)
    folders = {}
    path = Path(sweep_dir) / SUBMISSIONS
    for line in path.read_text().splitlines() if path.exists() else []:
        entry = json.loads(line)
        folders[str(entry["job_id"])] = Path(entry["folder"])
    states = slurm_job_states(job_id for job_id, _, _ in table.values())
    out = []
    for number, (job_id, overrides, layout) in sorted(table.items(), key=lambda item: int(item[0])):
        state = states.get(job_id)
        folder = folders.get(job_id)
        result = _result(folder, job_id) if folder else None
        out.append(
            {"job": number, "slurm_id": job_id, "overrides": overrides, "layout": layout,
             "state": state.state if state else "UNKNOWN", "result": result}
        )
    return out


def render(sweep_dir: Path, found: List[Dict[str, Any]]) -> str:
    header = ("job", "slurm id", "overrides", "state", "result")
    cells = [header] + [
        (r["job"], r["slurm_id"], r["overrides"], r["state"], r["result"] if r["result"] is not None else "-")
        for r in found
    ]
    widths = [max(len(str(row[i])) for row in cells) for i in range(len(header))]
    lines = [f"hpc-train-report: {sweep_dir} (a Hydra app's sweep of {len(found)} job{'s' if len(found) != 1 else ''})"]
    for index, row in enumerate(cells):
        lines.append("  ".join(str(value).ljust(width) for value, width in zip(row, widths)).rstrip())
        if index == 0:
            lines.append("  ".join("-" * width for width in widths))
    counts: Dict[str, int] = {}
    for r in found:
        counts[r["state"]] = counts.get(r["state"], 0) + 1
    lines.append("states: " + ", ".join(f"{n} {state}" for state, n in sorted(counts.items())))
    return "\n".join(lines)
