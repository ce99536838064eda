"""The batch script submitit would write for a job's parameters, rendered without submitting (the dry run's text)."""

from __future__ import annotations

import os
import shlex
from pathlib import Path
from typing import Any, Dict, Optional

from hpc_train.launch.backends.slurm.step import STEP_KEY, step_python

_SBATCH_KEYS = frozenset(
    "job_name nodes ntasks_per_node cpus_per_task time gres gpus_per_node partition account qos constraint mem".split()
)
# Those that shape the rest of the script (array_parallelism matters only to arrays, which are not rendered).
_SCRIPT_KEYS = frozenset(
    f"setup signal_delay_s stderr_to_stdout srun_args additional_parameters array_parallelism {STEP_KEY}".split()
)
# submitit's defaults that it writes as #SBATCH lines when not given.
_SUBMITIT_DEFAULTS = {"job_name": "submitit", "time": 5, "nodes": 1, "wckey": "submitit"}


def sbatch_flag(key: str, value: Any) -> str:
    key = key.replace("_", "-")
    return f"#SBATCH --{key}" if value is True else f"#SBATCH --{key}={shlex.quote(str(value))}"


def render_sbatch(folder: Path, params: Dict[str, Any], python: Optional[str] = None) -> str:
    """The sbatch script submitit submits for one job with these parameters (nothing is submitted); `python`: the
    submitting Python, when it is not this one (a laptop's dry run shows the cluster's).

    hpc_train renders it itself: submitit has no public way to render its script without
    submitting (only private methods), so hpc_train owns this text, line for line what submitit
    1.5 writes into ``<folder>/<job id>_submission.sh`` (its ``%j_%t_log.out/.err`` log names,
    its ``--signal``, wckey and ``open-mode``, its ``srun ... -m submitit.core._submit <folder>``
    command). Submission itself still goes through submitit's executor; a test compares this text
    with the file submitit writes, so a submitit upgrade that changes its script fails there.
    """
    unknown = sorted(set(params) - _SBATCH_KEYS - _SCRIPT_KEYS)
    if unknown:
        raise ValueError(f"render_sbatch does not know the submitit parameter(s) {unknown}")
    folder = Path(folder).expanduser().absolute()
    stdout, stderr = str(folder / "%j_%t_log.out"), str(folder / "%j_%t_log.err")
    options: Dict[str, Any] = {**_SUBMITIT_DEFAULTS}
    options.update({key: value for key, value in params.items() if key in _SBATCH_KEYS and value is not None})
    # submitit's preemption signal (SUBMITIT_PREEMPT_SIGNAL, else USR2): submitit reads it too;
    # slurm_parameters overrides it through additional_parameters for any other signal.
    preempt = os.environ.get("SUBMITIT_PREEMPT_SIGNAL", "USR2")
    options["signal"] = f"{preempt}@{params.get('signal_delay_s', 90)}"
    options["output"] = stdout.replace("%t", "0")
    if not params.get("stderr_to_stdout"):
        options["error"] = stderr.replace("%t", "0")
    options["open-mode"] = "append"
    options.update(params.get("additional_parameters") or {})
    lines = ["#!/bin/bash", "", "# Parameters", *(sbatch_flag(key, options[key]) for key in sorted(options))]
    if params.get("setup") is not None:
        lines += ["", "# setup", *params["setup"]]
    command = f"{step_python(folder, params, python=python)} -u -m submitit.core._submit {shlex.quote(str(folder))}"
    lines += ["", "# command", "export SUBMITIT_EXECUTOR=slurm", command, ""]
    return "\n".join(lines)
