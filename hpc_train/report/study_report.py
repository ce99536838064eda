"""`hpc-train-report SWEEP_DIR` of an adaptive sweep (``hydra/sweeper=adaptive``): its trials, its best, its cost.

The study's whole state is its Optuna journal (hpc_train.jobs.study); each trial's run dir adds its layout
(``job_config.yaml``) and where it ran (``summary.json``'s device). One row per trial: its parameters, its objective
at each rung it finished (the rung's budget in the header), its status, the best so far marked. Below: the trials by
status, the best trial, and what the study spent, in GPU-hours (a CPU run's ranks count as its devices), against what
a sweep that trained every trial to the full budget would have cost. ``--watch`` redraws it (report/watch.py's loop)
until the study has ended. Read-only, no torch; Optuna is imported only by jobs/study.py, when a journal exists.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Dict, Optional, Sequence, Tuple

import yaml

from hpc_train.jobs import study
from hpc_train.jobs.text_table import format_table
from hpc_train.records import rundir

FINISHED = ("COMPLETE", "PRUNED", "FAIL")  # Optuna's states of a trial that will not run again
ERROR_CHARS = 100  # a failed trial's error, in its one line of the table
Row = Dict[str, Any]  # a trial as jobs.study.trial_rows gives it


@dataclass
class Cost:
    spent_h: float  # the finished rungs' seconds x their trial's devices, in hours
    full_h: Optional[float]  # every trial at the full budget (None: the journal holds no budgets)
    cpu: bool  # some trial ran on CPUs: its ranks are its devices


def is_study(path: Path) -> bool:
    return study.journal_path(path).exists()


# -- reading it -------------------------------------------------------------------------------------
def _read_yaml(path: Path) -> Any:
    try:
        return yaml.load(path.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    except (OSError, yaml.YAMLError):
        return None


def devices(run_dir: Path) -> Tuple[int, bool]:
    """(the devices a trial's job held, whether they are CPU processes): nodes x tasks per node x GPUs per task from
    its job_config.yaml's layout, or its ranks when it ran on CPUs (summary.json's device, or no GPU in the layout)."""
    spec = _read_yaml(run_dir / rundir.JOB_CONFIG)
    layout = spec.get("job", {}).get("layout") if isinstance(spec, dict) else None
    layout = layout if isinstance(layout, dict) else {}
    summary = rundir.read_summary(run_dir) or {}
    ranks_per_node = int(layout.get("tasks_per_node") or 1)
    gpus = int(layout.get("nodes") or 1) * ranks_per_node * int(layout.get("gpus_per_task") or 0)
    if gpus and summary.get("device") != "cpu":
        return gpus, False
    return int(layout.get("world_size") or summary.get("world_size") or 1), True


def objective_name(info: Dict[str, Any], rows: Sequence[Row]) -> str:
    """The summary key the trials are ranked by: the sweeper's, else the config's (in a trial's job_config.yaml)."""
    if info.get("objective"):
        return str(info["objective"])
    for row in rows:
        spec = _read_yaml(Path(row["run_dir"]) / rundir.JOB_CONFIG) if row.get("run_dir") else None
        if isinstance(spec, dict) and spec.get("objective"):
            return str(spec["objective"])
    return "objective"


def best_trial(info: Dict[str, Any], rows: Sequence[Row]) -> Optional[Row]:
    """The best completed trial; before any completed, the best at the highest rung a trial finished (not failed)."""
    sign = 1.0 if info["direction"] == "minimize" else -1.0
    done = [row for row in rows if row["value"] is not None]
    if done:
        return min(done, key=lambda row: (sign * row["value"], row["number"]))
    reached = [row for row in rows if row["rung_values"] and row["status"] != "failed"]
    if not reached:
        return None
    top = max(max(row["rung_values"]) for row in reached)
    return min(
        (row for row in reached if top in row["rung_values"]),
        key=lambda row: (sign * row["rung_values"][top], row["number"]),
    )


def cost(info: Dict[str, Any], rows: Sequence[Row]) -> Cost:
    """Device-hours of the finished rungs, and of every trial trained to max_resource at its own measured seconds
    per budget unit (a promoted rung resumes, so a trial has run the budget of the highest rung it finished)."""
    budgets = info.get("budgets") or []
    spent = full = 0.0
    cpu = False
    for row in rows:
        seconds = sum(row["rung_seconds"].values())
        if not seconds or not row.get("run_dir"):
            continue
        count, on_cpu = devices(Path(row["run_dir"]))
        cpu = cpu or on_cpu
        spent += seconds * count
        if budgets:
            ran = budgets[max(row["rung_seconds"])]  # None: no scheduler, the trial's own length
            full += seconds * count * (budgets[-1] / ran if ran else 1.0)
    return Cost(spent / 3600, full / 3600 if budgets else None, cpu)


def ended(info: Dict[str, Any], rows: Sequence[Row]) -> bool:
    """Every trial finished to Optuna (a paused one is RUNNING until the study stops it) and none is left to start."""
    started_all = len(rows) >= int(info.get("max_trials") or 0)
    return bool(rows) and started_all and all(row["state"] in FINISHED for row in rows)


# -- showing it -------------------------------------------------------------------------------------
def _one_line(error: Optional[str]) -> str:
    line = next((part.strip() for part in str(error or "").splitlines() if part.strip()), "(no error recorded)")
    return line if len(line) <= ERROR_CHARS else line[: ERROR_CHARS - 3] + "..."


def status_text(row: Row) -> str:
    """running rung k / promoted to rung k, running / paused at rung k / completed / stopped at rung k / failed."""
    rung, status = row["rung"], row["status"]
    if status == "running":
        promoted = any(done < rung for done in row["rung_values"])
        return f"promoted to rung {rung}, running" if promoted else f"running rung {rung}"
    if status in ("paused", "stopped"):
        return f"{status} at rung {rung}"
    if status == "failed":
        return f"failed at rung {rung}: {_one_line(row['error'])}"
    return status or "starting"  # completed; None: asked, its first rung not started yet


def _cell(value: Any, spec: str) -> str:
    if isinstance(value, float):
        return format(value, spec)
    return "-" if value is None else str(value)


def table(info: Dict[str, Any], rows: Sequence[Row], best: Optional[Row]) -> str:
    """One row per trial: number, best (*), parameters, each rung's objective (header: rung and budget), status."""
    budgets = info.get("budgets") or []
    rungs = len(budgets) or 1 + max((max(row["rung_values"], default=0) for row in rows), default=0)
    names = list(dict.fromkeys(name for row in rows for name in row["params"]))
    brackets = any(row["bracket"] for row in rows)  # hyperband: bracket b starts at rung b
    rung_names = [f"rung {k}" + (f" @{budgets[k]}" if k < len(budgets) and budgets[k] else "") for k in range(rungs)]
    header = ["trial", "best", *names, *(["bracket"] if brackets else []), *rung_names, "status"]
    body = [
        [
            row["number"],
            "*" if best is not None and row["number"] == best["number"] else "",
            *(_cell(row["params"].get(name), ".4g") for name in names),
            *([_cell(row["bracket"], "d")] if brackets else []),
            *(_cell(row["rung_values"].get(k), ".4f") for k in range(rungs)),
            status_text(row),
        ]
        for row in rows
    ]
    return format_table(header, body, right={"trial", "bracket", *names, *rung_names})


def counts(info: Dict[str, Any], rows: Sequence[Row]) -> str:
    by = {name: sum(row["status"] == name for row in rows) for name in ("completed", "stopped", "failed", "paused")}
    running = len(rows) - sum(by.values())  # running, or asked and about to start
    of = f" of {info['max_trials']}" if info.get("max_trials") else ""
    return (
        f"trials: {by['completed']} completed, {by['stopped']} stopped, {by['failed']} failed, {running} running,"
        f" {by['paused']} paused ({len(rows)}{of} started)"
    )


def best_line(info: Dict[str, Any], rows: Sequence[Row], best: Optional[Row]) -> str:
    if best is None:
        return "best: none yet (no trial has finished a rung)"
    objective = objective_name(info, rows)
    params = " ".join(f"{name}={value}" for name, value in best["params"].items())
    if best["value"] is not None:
        return f"best: trial {best['number']}, {objective} = {best['value']:g}, {params}"
    top = max(best["rung_values"])
    value = best["rung_values"][top]
    return f"best so far (none completed): trial {best['number']}, {objective} = {value:g} at rung {top}, {params}"


def _hours(hours: float) -> str:
    return f"{hours:,.2f}" if hours >= 1 else f"{hours:.2g}"  # a small study's too: 0.0019, not 0.00


def cost_line(info: Dict[str, Any], spent: Cost) -> str:
    unit = "device-hours (CPU runs: seconds x ranks)" if spent.cpu else "GPU-hours (seconds x GPUs)"
    line = f"{unit}: {_hours(spent.spent_h)} spent on the finished rungs"
    if spent.full_h is None:
        return line + "; the journal holds no budgets to compare with a full-budget sweep"
    budget = (info.get("budgets") or [None])[-1]
    full = f"{info.get('resource_key')}={budget}" if budget else "its full length"
    ratio = f"; ratio {spent.spent_h / spent.full_h:.2f}" if spent.full_h else ""
    return line + f", against {_hours(spent.full_h)} for every trial at {full}{ratio}"


def render(sweep_dir: Path, info: Dict[str, Any], rows: Sequence[Row], controller: Optional[str] = None) -> str:
    """The report; `controller`: the line on the study's controller (jobs.study.controller_state), left out once the
    study has ended."""
    best = best_trial(info, rows)
    lines = [
        f"hpc-train-report: {sweep_dir} (adaptive study of {len(rows)} trial{'s' if len(rows) != 1 else ''},"
        f" {info['direction']} {objective_name(info, rows)})",
        table(info, rows, best) if rows else "(no trial yet)",
        "(rung k @N: the objective after the rung, at a budget of N; * the best so far)",
        counts(info, rows),
        best_line(info, rows, best),
        cost_line(info, cost(info, rows)),
    ]
    return "\n".join(lines + ([controller] if controller and not ended(info, rows) else []))


# -- the command ------------------------------------------------------------------------------------
def main(sweep_dir: Path, as_json: bool) -> int:
    """The study's report (or its trials, best and cost as JSON); 0, or 2 when the journal holds no study."""
    found = study.read_study(sweep_dir)
    if found is None:
        print(f"hpc-train-report: {sweep_dir} holds no {study.JOURNAL}", flush=True)
        return 2
    info, rows = found
    if as_json:
        best = best_trial(info, rows)
        out = {"study": info, "trials": rows, "best": best and best["number"], "cost": asdict(cost(info, rows))}
        out["controller"] = dict(zip(("alive", "line"), study.controller_state(sweep_dir)))
        print(json.dumps(out, indent=2))
    else:
        print(render(sweep_dir, info, rows, study.controller_state(sweep_dir)[1]))
    return 0


def look(sweep_dir: Path) -> Tuple[str, Optional[int]]:
    """--watch: (the report as it is now, the exit code once the study has ended: 0 when a trial completed and none
    failed, else 1; None while it goes on)."""
    found = study.read_study(sweep_dir)
    info, rows = found or ({"direction": "minimize"}, [])
    alive, controller = study.controller_state(sweep_dir)
    text = f"hpc-train-report --watch {sweep_dir}  ({time.strftime('%H:%M:%S')})\n"
    text += render(sweep_dir, info, rows, controller)
    if ended(info, rows):
        ok = any(row["status"] == "completed" for row in rows) and not any(row["status"] == "failed" for row in rows)
        return text + "\nhpc-train-report: the study has ended", 0 if ok else 1
    if found is not None and not alive:  # nothing will change: stop watching, saying so
        return text + "\nhpc-train-report: the study has not ended and its controller is not running; --watch ends", 1
    return text, None
