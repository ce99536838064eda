"""``hpc_train.log_metrics(step=..., **metrics)``: a script of your own writes hpc_train's metrics.jsonl.

Under ``hpc-train ... -- train.py``, every rank's environment holds ``HPC_TRAIN_RUN_DIR``; rank 0's
calls append one ``{"kind": "train", "step": ..., ...}`` line to the run dir's ``metrics.jsonl``,
which ``hpc-train-report`` (its loss curve, ``--watch``) and the job's ``summary.json`` (the last
values, so Optuna can read an ``objective``) read as for hpc_train's own jobs. Elsewhere (the same
script run by hand, or on another rank) it does nothing, so a script can call it unconditionally.
No torch here: tensors are read through ``.item()``.

``hpc_train.report_objective(step, value)`` is the one line a script or any Hydra app adds for an adaptive sweep
(``hydra/sweeper=adaptive``): rank 0 appends ``{"kind": "objective", "step": ..., "value": ...}`` to the same file,
in an hpc-train job's run dir or, in a Hydra app, its job's output dir; the sweep ranks a rung by the last one.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from hpc_train.records import rundir

RUN_DIR_VARIABLE = "HPC_TRAIN_RUN_DIR"
ATTEMPT_VARIABLE = "HPC_TRAIN_ATTEMPT"
LAUNCH_ID_VARIABLE = "HPC_TRAIN_LAUNCH_ID"  # set by the local launcher: one value per launch (an attempt)
LOCAL_LAUNCHER_VARIABLE = "HPC_TRAIN_LOCAL_LAUNCHER"  # "1" on the local launcher's ranks: trust their RANK etc.
OBJECTIVE = "objective"  # the kind of a row report_objective writes


def _number(value: Any) -> Any:
    """A tensor or numpy scalar as a plain number; anything else as it is."""
    return value.item() if hasattr(value, "item") else value


def log_metrics(step: int, kind: str = "train", **metrics: Any) -> Optional[Dict[str, Any]]:
    """Append a metrics row as rank 0 of an hpc_train job (``kind="eval"`` for an evaluation); the row, or None
    where nothing was written (outside hpc_train, or not rank 0)."""
    record = {"kind": kind, "step": int(step), **{k: _number(v) for k, v in metrics.items()}, "time": time.time()}
    return _append(os.environ.get(RUN_DIR_VARIABLE), record)


def report_objective(step: int, value: Any) -> Optional[Dict[str, Any]]:
    """Report the objective `value` reached at `step` to an adaptive sweep: one metrics row by rank 0, in the run dir
    of an hpc-train job or the output dir of a Hydra app's job; the row, or None where nothing was written (no run
    dir: not under hpc-train or Hydra; or not rank 0)."""
    record = {"kind": OBJECTIVE, "step": int(step), "value": float(_number(value)), "time": time.time()}
    return _append(os.environ.get(RUN_DIR_VARIABLE) or _hydra_output_dir(), record)


def _append(run_dir: Optional[str], record: Dict[str, Any]) -> Optional[Dict[str, Any]]:
    """`record` appended to `run_dir`'s metrics.jsonl by rank 0; None where nothing was written (no run dir, or
    another rank)."""
    if not run_dir or os.environ.get("RANK", "0") != "0":
        return None
    with open(Path(run_dir) / rundir.METRICS, "a") as handle:
        handle.write(json.dumps(record) + "\n")
    return record


def last_objective(run_dir: Path) -> Optional[Tuple[int, float]]:
    """(step, value) of the last objective row reported in `run_dir` (a NaN is a value too), or None."""
    path = Path(run_dir) / rundir.METRICS
    rows = rundir.read_jsonl(path) if path.exists() else []
    reported = [row for row in rows if row.get("kind") == OBJECTIVE]
    if not reported:
        return None
    last = reported[-1]
    return int(last["step"]), float(last["value"])


def reported_values(run_dir: Path, objective: Optional[str], since: float = 0.0) -> List[Tuple[int, float, float]]:
    """(step, value, time) of each objective the run in `run_dir` reported since `since` (epoch seconds), in order: its
    report_objective rows, or without any, the rows that fill the summary's `objective` key (``train_loss``: the
    ``loss`` of its train rows, ``eval_loss``: of its eval rows). What a running job has reached so far."""
    path = Path(run_dir) / rundir.METRICS
    rows = [row for row in (rundir.read_jsonl(path) if path.exists() else []) if row.get("time", since) >= since]
    kind, name = OBJECTIVE, "value"  # report_objective's rows
    if not any(row.get("kind") == OBJECTIVE for row in rows) and objective and "_" in objective:
        kind, name = objective.split("_", 1)
    reported = [(row.get("step"), row.get(name), row.get("time")) for row in rows if row.get("kind", "train") == kind]
    numbers = [row for row in reported if isinstance(row[1], (int, float)) and not isinstance(row[1], bool)]
    return [(int(step), float(value), float(at or since)) for step, value, at in numbers if step is not None]


def _hydra_output_dir() -> Optional[str]:
    """The output dir of the Hydra job this process runs, if Hydra runs one (never imported here for it)."""
    module = sys.modules.get("hydra.core.hydra_config")
    if module is None or not module.HydraConfig.initialized():
        return None
    return str(module.HydraConfig.get().runtime.output_dir)
