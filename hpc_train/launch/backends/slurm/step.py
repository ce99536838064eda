"""The command of a Slurm job submitted by hpc_train: its outer process on the batch host starts the job step.

The batch script ``exec``s hpc_train's batch-host agent (hpc_train.batchhost.agent), which runs
``srun [container flags] [container prefix] PYTHON -u -m submitit.core._submit FOLDER``: with a container, PYTHON is
the image's (through hpc_train's entry that checks the image); without one, the launching environment's. One path
either way: the signal reaches the agent (``#SBATCH --signal=B:...``), the agent passes it to the step, and the
ranks' requests (requeue, a hang's nodes) are carried out by the agent, outside any image.
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional

from hpc_train.config.view import ConfigView, plain
from hpc_train.containers.base import StepCommand
from hpc_train.containers.job_step import container_step
from hpc_train.containers.settings import ContainerSettings
from hpc_train.contracts.replica_plan import ReplicaPlan, replica_plan
from hpc_train.launch.planning.layout import JobLayout

AGENT = "hpc_train.batchhost.agent"
STEP_KEY = "step"  # the sbatch parameters' entry describing the job step (hpc_train's, not submitit's)


def step_parameters(cfg: ConfigView, layout: JobLayout, run_dir: Path) -> Dict[str, Any]:
    """What the job step's command is made of, as data (stored with the sbatch parameters, so a rerun makes the same
    command): the container section, the folder every run of the submission lives in, GPUs or not. A sweep's runs
    share their parent folder, so their jobs still go in as one array."""
    section = plain(cfg.get("container"))
    container = section if ContainerSettings.from_section(section).enabled else None
    step = {"container": container, "binds": [str(Path(run_dir).absolute().parent)], "gpus": layout.gpus_per_node > 0}
    node = plain(cfg.get("fault_tolerance")) or {}
    if node.get("replica_groups"):  # one step per replica group, run by the batch host's agent (batchhost/groups.py)
        step["replicas"] = replica_plan(layout, node, run_dir).record()
    return step


def job_files_of(folder: Path) -> Path:
    """The folder without Slurm's %j-style parts (a Hydra app's submitit_folder may have them)."""
    parts = Path(folder).absolute().parts
    return Path(*parts[: next((i for i, p in enumerate(parts) if "%" in p), len(parts))])


def container_of(step: Dict[str, Any], job_files: Path, stage: bool) -> Optional[StepCommand]:
    """The step's command in its image (None: no container), its files in `job_files` (the submission's folder
    without %j-style parts); `stage`: hpc_train's library copied and the step's files (an OCI bundle) written now,
    as a submission needs them; a dry run only names them."""
    settings = ContainerSettings.from_section(step.get("container"))
    binds = [*step.get("binds", []), str(job_files)]
    command = container_step(settings, binds, bool(step.get("gpus")), job_files, stage=stage)
    if command is not None and stage:
        command.write_files()
    return command


def log_pattern(folder: Path, array: bool, stream: str) -> str:
    """srun's --output/--error as submitit names its task logs: an array's tasks by ``%A_%a`` wherever ``%j`` stands,
    in a Hydra app's folder too (``.submitit/%j``)."""
    pattern = str(Path(folder).expanduser().absolute() / f"%j_%t_log.{stream}")
    return pattern.replace("%j", "%A_%a") if array else pattern


def step_python(
    folder: Path, params: Dict[str, Any], array: bool = False, stage: bool = False, python: Optional[str] = None
) -> str:
    """submitit's ``python`` for this job (the words before ``-u -m submitit.core._submit FOLDER``): the agent, then
    the step's srun line up to the Python that runs each task. `stage`: write what the container needs (an OCI
    bundle, hpc_train's library) now; a dry run only names it. `python`: the submitting Python (default: this one;
    a laptop's dry run names the cluster's)."""
    python = python or sys.executable
    step = params.get(STEP_KEY) or {}
    job_files = job_files_of(folder)
    error = [] if params.get("stderr_to_stdout") else ["--error", log_pattern(folder, array, "err")]
    srun = ["srun", "--unbuffered", "--output", log_pattern(folder, array, "out"), *error]
    srun += params.get("srun_args") or []
    container = container_of(step, job_files, stage)
    agent: List[str] = [python, "-m", AGENT, "--requests", str(job_files)]
    if step.get("replicas"):
        agent += ["--replicas", ReplicaPlan.from_record(step["replicas"]).text()]
    inner: List[str] = [python]
    if container is not None:
        agent += [f"--unset={name}" for name in container.unset]
        agent += [f"--set={key}={value}" for key, value in sorted(container.set_env.items())]
        srun += container.srun_flags
        inner = container.argv([])
    return "exec " + shlex.join([*agent, "--", *srun, *inner])
