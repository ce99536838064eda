"""``hpc_train.log_metrics(step=..., **metrics)``: a script of your own writes hpc_train's metrics.jsonl.

Under ``hpc-train ... -- train.py``, every rank's environment holds ``HPC_TRAIN_RUN_DIR``; rank 0's
calls append one ``{"kind": "train", "step": ..., ...}`` line to the run dir's ``metrics.jsonl``,
which ``hpc-train-report`` (its loss curve, ``--watch``) and the job's ``summary.json`` (the last
values, so Optuna can read an ``objective``) read as for hpc_train's own jobs. Elsewhere (the same
script run by hand, or on another rank) it does nothing, so a script can call it unconditionally.
No torch here: tensors are read through ``.item()``.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any, Dict, Optional

from hpc_train.records import rundir

RUN_DIR_VARIABLE = "HPC_TRAIN_RUN_DIR"
ATTEMPT_VARIABLE = "HPC_TRAIN_ATTEMPT"
LAUNCH_ID_VARIABLE = "HPC_TRAIN_LAUNCH_ID"  # set by the local launcher: one value per launch (an attempt)
LOCAL_LAUNCHER_VARIABLE = "HPC_TRAIN_LOCAL_LAUNCHER"  # "1" on the local launcher's ranks: trust their RANK etc.


def _number(value: Any) -> Any:
    """A tensor or numpy scalar as a plain number; anything else as it is."""
    return value.item() if hasattr(value, "item") else value


def log_metrics(step: int, kind: str = "train", **metrics: Any) -> Optional[Dict[str, Any]]:
    """Append a metrics row as rank 0 of an hpc_train job (``kind="eval"`` for an evaluation); the row, or None
    where nothing was written (outside hpc_train, or not rank 0)."""
    run_dir = os.environ.get(RUN_DIR_VARIABLE)
    if not run_dir or os.environ.get("RANK", "0") != "0":
        return None
    record = {"kind": kind, "step": int(step), **{k: _number(v) for k, v in metrics.items()}, "time": time.time()}
    with open(Path(run_dir) / rundir.METRICS, "a") as handle:
        handle.write(json.dumps(record) + "\n")
    return record
