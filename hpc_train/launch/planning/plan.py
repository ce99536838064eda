"""Turn a composed config into a concrete plan: how many GPUs, which layout, where outputs go."""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Union

from omegaconf import DictConfig

from hpc_train.config.checks import count_range
from hpc_train.config.engine import checked_view
from hpc_train.config.errors import ConfigError
from hpc_train.config.launcher import launcher_kind
from hpc_train.config.view import ConfigView
from hpc_train.launch.planning.layout import JobLayout
from hpc_train.launch.planning.parallelism import Parallelism, resolve_node_range, resolve_parallelism
from hpc_train.launch.planning.validate import check_layout, validate
from hpc_train.processes.script_command import is_script_job

CPU_WORKERS_WITHOUT_GPU = 2


@dataclass(frozen=True)
class RunPlan:
    """A validated job: its resolved config, its parallel dimensions (layout included) and its run dir."""

    config: ConfigView
    parallel: Parallelism
    run_dir: Path

    @property
    def layout(self) -> JobLayout:
        return self.parallel.layout


def count_local_gpus() -> int:
    """GPUs visible on this machine, found without importing torch (nvidia-smi or CUDA_VISIBLE_DEVICES)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return len([d for d in visible.split(",") if d.strip() and d.strip() != "-1"])
    if shutil.which("nvidia-smi") is None:
        return 0
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20, check=False).stdout
    except (OSError, subprocess.TimeoutExpired):
        return 0
    return sum(1 for line in out.splitlines() if line.startswith("GPU "))


def resolve_gpus_per_node(cfg: ConfigView) -> int:
    """resources.gpus_per_node, else the cluster profile's, else (local only) what this machine has."""
    for value in (cfg.resources.gpus_per_node, cfg.cluster.get("gpus_per_node")):
        if value is not None:  # type and range: each key's declaration, checked before any layout
            return value
    if launcher_kind(cfg.launcher.name).on_this_machine:
        return count_local_gpus() or CPU_WORKERS_WITHOUT_GPU
    raise ConfigError(
        "resources.gpus_per_node",
        "the cluster profile does not say how many GPUs a node has.",
        "pass resources.gpus_per_node=N or set gpus_per_node in your cluster profile.",
    )


def torchrun_layout(layout: JobLayout) -> JobLayout:
    """The layout of a script under torchrun: one task per node holding all its GPUs (and their CPUs)."""
    return replace(
        layout,
        tasks_per_node=1,
        gpus_per_task=layout.gpus_per_node,
        cpus_per_task=layout.cpus_per_task * layout.tasks_per_node,
    )


def make_plan(cfg: Union[DictConfig, ConfigView], run_dir: Path) -> RunPlan:
    """Resolve the config, the parallel dimensions and validate everything; raises ConfigError before anything starts.

    Every key's type and range is checked first (``config.engine.checked_view``, which also resolves
    the config once), so the layout and the checks after it only see values of the right kind.
    A sweep passes a view it resolved itself (already checked the same way).
    """
    view = cfg if isinstance(cfg, ConfigView) else checked_view(cfg)
    local = launcher_kind(view.launcher.name).on_this_machine
    nodes, max_nodes = count_range(view.resources.nodes)  # N, or a range MIN-MAX Slurm chooses from
    if local and max_nodes != 1:
        raise ConfigError(
            "resources.nodes",
            f"launcher=local runs on this machine only, but resources.nodes={view.resources.nodes}.",
            "use launcher=slurm for several nodes, or set resources.nodes=1.",
        )
    gpus, cpus_per_gpu = resolve_gpus_per_node(view), int(view.cluster.get("cpus_per_gpu") or 1)
    if max_nodes > nodes:  # every count of the range resolved and checked, here, before anything is queued
        check = functools.partial(check_layout, view, run_dir=run_dir)
        parallel = resolve_node_range(view.strategy, nodes, max_nodes, gpus, cpus_per_gpu, local, check)
    else:
        parallel = resolve_parallelism(view.strategy, nodes, gpus, cpus_per_gpu, local)
    if is_script_job(view) and view.script.get("launcher") == "torchrun":  # one torchrun per node starts its ranks
        parallel = replace(parallel, layout=torchrun_layout(parallel.layout))
    layout = parallel.layout
    if local:
        gpus = count_local_gpus()
        if gpus and layout.tasks_per_node > gpus:
            raise ConfigError(
                "resources.gpus_per_node",
                f"{layout.describe()} starts {layout.tasks_per_node} processes, but this machine has {gpus} GPU(s) and"
                " NCCL cannot share one GPU between ranks.",
                f"set resources.gpus_per_node={gpus}, or run CPU workers with CUDA_VISIBLE_DEVICES= hpc-train ...",
            )
    validate(view, parallel, run_dir)
    return RunPlan(view, parallel, run_dir)
