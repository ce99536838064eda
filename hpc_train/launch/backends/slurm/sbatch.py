"""`launcher=sbatch`: the first command of a plain sbatch script (see ``sbatch/*.slurm``).

It runs once, inside the allocation and before ``srun``: it composes and validates the config
exactly as ``launcher=slurm`` would, checks that the allocation Slurm granted has the shape the
strategy needs (nodes, tasks, GPUs per node: a script edited on one side only fails here, with
the fix, instead of training with the wrong ranks), and writes ``<run dir>/job_config.yaml``.
The script then starts every rank with

    srun python -m hpc_train.compute.worker <run dir>/job_config.yaml

where each task reads its rank from srun's variables (``SLURM_PROCID``, ``SLURM_LOCALID``,
``SLURM_STEP_NUM_TASKS``; no torchrun). Login-node safe: no torch import.
"""

from __future__ import annotations

import os
import sys
from typing import Any, Dict, List, Mapping, Optional

from hpc_train.config.errors import ConfigError
from hpc_train.config.launcher import LauncherKind
from hpc_train.launch.backends.base import Backend, JobRef, JobWatch
from hpc_train.launch.backends.local.backend import LocalWatch
from hpc_train.launch.planning.jobspec import write_job_spec
from hpc_train.launch.planning.layout import JobLayout
from hpc_train.launch.planning.plan import RunPlan

WORKER = "python -m hpc_train.compute.worker"


def _int(env: Mapping[str, str], *names: str) -> Optional[int]:
    for name in names:
        value = env.get(name, "")
        if value.isdigit():
            return int(value)
    return None


def check_allocation(layout: JobLayout, env: Mapping[str, str]) -> List[str]:
    """Raise ConfigError when the allocation cannot run `layout`; return warnings for harmless differences."""
    if "SLURM_JOB_ID" not in env:
        return ["not inside a Slurm allocation (no SLURM_JOB_ID): the allocation was not checked"]
    how = (
        "the #SBATCH lines (or sbatch's command-line options) and the hpc-train overrides of the script must describe"
        " the same job"
    )
    nodes = _int(env, "SLURM_JOB_NUM_NODES", "SLURM_NNODES")
    if nodes is not None and nodes not in layout.node_counts:
        raise ConfigError(
            "resources.nodes",
            f"the allocation has {nodes} node(s), but the overrides plan {layout.nodes_text} ({layout.describe()});"
            f" {how}.",
            f"use `#SBATCH --nodes={layout.nodes_text}`, or pass resources.nodes={nodes} to hpc-train in the script.",
        )
    tasks = _int(env, "SLURM_NTASKS")
    planned = (nodes if nodes is not None and layout.max_nodes else layout.nodes) * layout.tasks_per_node
    if tasks is not None and tasks != planned:
        raise ConfigError(
            "strategy",
            f"the allocation has {tasks} task(s), but the overrides plan {planned} ranks ({layout.describe()}); {how}.",
            f"use `#SBATCH --nodes={layout.nodes_text}` and `#SBATCH --ntasks-per-node={layout.tasks_per_node}` (the"
            " dry run `hpc-train launcher=slurm dry_run=true ...` prints them).",
        )
    gpus = _int(env, "SLURM_GPUS_ON_NODE")
    if gpus is not None and gpus < layout.gpus_per_node:
        raise ConfigError(
            "resources.gpus_per_node",
            f"the allocation has {gpus} GPU(s) per node, but the overrides plan {layout.gpus_per_node}"
            f" ({layout.describe()}); {how}.",
            f"use `#SBATCH --gres=gpu:{layout.gpus_per_node}`, or pass resources.gpus_per_node={gpus}.",
        )
    warnings = []
    cpus = _int(env, "SLURM_CPUS_PER_TASK")
    if cpus is not None and cpus != layout.cpus_per_task:
        warnings.append(
            f"the allocation gives {cpus} CPU(s) per task, the cluster profile plans {layout.cpus_per_task}; training"
            f" uses {cpus}"
        )
    return warnings


class SbatchBackend(Backend):
    """``launcher=sbatch``: the first step of the user's own batch script, inside its allocation. It checks the
    allocation against the plan and writes the job spec; the script's ``srun`` starts the ranks."""

    def __init__(self, kind: LauncherKind, env: Optional[Mapping[str, str]] = None) -> None:
        super().__init__(kind)
        self.env = os.environ if env is None else env

    def _warn(self, plan: RunPlan) -> None:
        for warning in check_allocation(plan.layout, self.env):
            print(f"hpc-train: warning: {warning}", file=sys.stderr)

    def dry_run(self, plan: RunPlan, spec: Dict[str, Any]) -> int:
        self._warn(plan)
        print(f"hpc-train (dry run, sbatch): {plan.layout.describe()}")
        return 0

    def start(self, plan: RunPlan, spec: Dict[str, Any], wait: bool) -> int:
        self._warn(plan)
        path = write_job_spec(spec, plan.run_dir)
        print(f"hpc-train: {plan.layout.describe()}")
        print(f"hpc-train: run dir {plan.run_dir}")
        print(f"hpc-train: job spec {path}; every rank: srun {WORKER} {path}")
        return 0

    def watch(self, ref: JobRef) -> JobWatch:
        return LocalWatch(ref)  # the command itself: it ends once the job spec is written
