"""What a job returns to a Hydra sweeper that optimises: the `objective` key of its summary.

Hydra's return-value sweepers (Optuna, Nevergrad, Ax, ...) call the task function, or read
the ``JobReturn`` our launcher hands back, and expect a float. hpc-train's own sweeper (the
default ``hydra/sweeper=hpc_train``, a grid like Hydra's basic one) ignores return values, and
so may queue Slurm jobs and return at once. Every other sweeper is taken to read them: then
each job is waited for and its ``summary.json[objective]`` is the return value. Nothing here is
specific to one sweeper.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any, Optional

from omegaconf import OmegaConf

from hpc_train.config.errors import ConfigError
from hpc_train.config.top import NUMERIC_SUMMARY_KEYS
from hpc_train.launch.planning.errors import JobFailed
from hpc_train.processes.script_command import is_script_job
from hpc_train.records import rundir

OWN_SWEEPER = "hydra_plugins.hpc_train_launcher.HpcTrainSweeper"


# A user step's metric `m` is reported as train_m and eval_m (hpc_train/compute/user/step.py).
STEP_METRIC = re.compile(r"(train|eval)_[A-Za-z_][A-Za-z0-9_]*")


def is_objective_name(value: Any) -> bool:
    """A numeric summary key, or the summary key of a metric a user step may report."""
    return isinstance(value, str) and (value in NUMERIC_SUMMARY_KEYS or STEP_METRIC.fullmatch(value) is not None)


def sweeper_target(hydra_cfg: Any) -> str:
    return str(OmegaConf.select(hydra_cfg, "sweeper._target_", default="") or "")


def sweeper_wants_objective(hydra_cfg: Any) -> bool:
    """True in a multirun whose sweeper is not hpc-train's own: it may read each job's return value."""
    mode = OmegaConf.select(hydra_cfg, "mode", default=None)
    return str(getattr(mode, "name", mode)) == "MULTIRUN" and sweeper_target(hydra_cfg) != OWN_SWEEPER


def check_objective(cfg: Any, hydra_cfg: Optional[Any] = None) -> None:
    """`objective` names a numeric summary key; a dry run cannot feed a sweeper that optimises."""
    key = cfg.get("objective")
    user_step = (cfg.get("trainer") or {}).get("step") is not None
    # A script job's summary holds what the script reported, under any name.
    if not is_script_job(cfg) and key not in NUMERIC_SUMMARY_KEYS and not (user_step and is_objective_name(key)):
        more = "" if user_step else " (train_<metric> and eval_<metric> name the metrics of a trainer.step)"
        raise ConfigError(
            "objective",
            f"{key!r} is not a numeric key of summary.json{more}.",
            f"use one of: {', '.join(NUMERIC_SUMMARY_KEYS)} (e.g. objective=eval_accuracy with"
            " hydra.sweeper.direction=maximize), or train_<name> / eval_<name> for a metric your trainer.step returns.",
        )
    if hydra_cfg is not None and sweeper_wants_objective(hydra_cfg) and cfg.get("dry_run"):
        raise ConfigError(
            "dry_run",
            f"a dry run trains nothing, so it has no {key} to return to the sweeper {sweeper_target(hydra_cfg)}.",
            "drop dry_run=true, or print the layouts with hpc-train's own sweeper (hydra/sweeper=hpc_train, the"
            " default).",
        )


def read_objective(run_dir: Path, key: str) -> float:
    """summary.json[key] of a finished job as a float; JobFailed (naming `objective`) when there is none."""
    summary = rundir.read_summary(run_dir)
    if summary is None:
        raise JobFailed(f"the job in {run_dir} wrote no {rundir.SUMMARY}, so it has no objective ({key}).")
    value = summary.get(key)
    if isinstance(value, float) and math.isnan(value):  # the run trained, and its loss is not a number
        raise JobFailed(
            f"`objective`: summary.json of {run_dir} has {key}=nan: the run diverged. Fix: lower trainer.lr, or clip"
            " the gradients (trainer.grad_clip)."
        )
    if value is None or not isinstance(value, (int, float)) or isinstance(value, bool):
        hint = " (trainer.eval=false runs no evaluation)" if value is None and key.startswith("eval_") else ""
        raise JobFailed(
            f"`objective`: summary.json of {run_dir} has {key}={value!r}{hint}; a sweeper needs a number. Fix: set"
            " objective= to a key this run reports, e.g. objective=train_loss."
        )
    return float(value)
