"""Turn a composed config into a concrete plan: how many GPUs, which layout, where outputs go."""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from omegaconf import DictConfig

from hpc_train.launch.errors import ConfigError
from hpc_train.launch.layout import JobLayout, compute_layout
from hpc_train.launch.schema import check_keys
from hpc_train.launch.validate import check_mesh, validate
from hpc_train.strategy_table import KINDS, split_settings, strategy_id

CPU_WORKERS_WITHOUT_GPU = 2


@dataclass(frozen=True)
class RunPlan:
    layout: JobLayout
    run_dir: Path


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


def resolve_gpus_per_node(cfg: DictConfig) -> int:
    """resources.gpus_per_node, else the cluster profile's, else (local only) what this machine has."""
    for key, value in (
        ("resources.gpus_per_node", cfg.resources.gpus_per_node),
        ("cluster.gpus_per_node", cfg.cluster.get("gpus_per_node")),
    ):
        if value is not None:
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError(key, f"must be a positive integer, got {value!r}.", f"set {key}=1 or more.")
            return value
    if cfg.launcher.name == "local":
        return count_local_gpus() or CPU_WORKERS_WITHOUT_GPU
    raise ConfigError(
        "resources.gpus_per_node",
        "the cluster profile does not say how many GPUs a node has.",
        "pass resources.gpus_per_node=N or set gpus_per_node in your cluster profile.",
    )


def make_plan(cfg: DictConfig, run_dir: Path) -> RunPlan:
    """Resolve the layout and validate everything; raises ConfigError before anything starts.

    Every key's type and range is checked first (``check_keys``), so the layout and the checks
    after it only ever see values of the right kind.
    """
    check_keys(cfg)
    if cfg.launcher.name == "local" and cfg.resources.nodes != 1:
        raise ConfigError(
            "resources.nodes",
            f"launcher=local runs on this machine only, but resources.nodes={cfg.resources.nodes}.",
            "use launcher=slurm for several nodes, or set resources.nodes=1.",
        )
    strategy = cfg.strategy
    kind = strategy_id(strategy)
    gpus_per_node = resolve_gpus_per_node(cfg)
    sharded = KINDS.get(kind) is not None and KINDS[kind].sharded
    layout = compute_layout(
        strategy=kind,
        nodes=cfg.resources.nodes,
        gpus_per_node=gpus_per_node,
        cpus_per_gpu=int(cfg.cluster.get("cpus_per_gpu") or 1),
        stages=split_settings(strategy).stages if KINDS.get(kind) and KINDS[kind].staged else None,
        mesh=check_mesh(strategy, cfg.resources.nodes, gpus_per_node) if sharded else None,
    )
    if cfg.launcher.name == "local":
        gpus = count_local_gpus()
        if gpus and layout.tasks_per_node > gpus:
            raise ConfigError(
                "resources.gpus_per_node",
                f"{layout.describe()} starts {layout.tasks_per_node} processes, but this machine has {gpus} GPU(s) and"
                " NCCL cannot share one GPU between ranks.",
                f"set resources.gpus_per_node={gpus}, or run CPU workers with CUDA_VISIBLE_DEVICES= hpc-train ...",
            )
    validate(cfg, layout, run_dir)
    return RunPlan(layout=layout, run_dir=run_dir)
