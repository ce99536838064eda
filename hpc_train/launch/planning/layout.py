"""The job layout of a strategy: what Slurm must allocate and how the processes use it.

The shapes themselves (one task per GPU, GPUs per task from the stages, single node...) are
declared once, per strategy identity, in :mod:`hpc_train.contracts.strategy_table`; this module turns
one into numbers. The Slurm renderer, the local launcher and the validation all read layouts
from here, so a strategy's shape is never written twice.
"""

from __future__ import annotations

from typing import Optional, Tuple

from hpc_train.config.errors import ConfigError
from hpc_train.config.strategy import HYBRID_STAGES, NAMES
from hpc_train.contracts.job_layout import JobLayout
from hpc_train.contracts.strategy_table import KINDS, StrategyKind

__all__ = ["JobLayout", "check_node_range", "compute_layout", "known_kind"]  # JobLayout: the record both sides read


def known_kind(strategy: str) -> StrategyKind:
    """The table row of a strategy identity; ConfigError for a name the table does not have."""
    if strategy not in KINDS:
        raise ConfigError("strategy", f"unknown strategy {strategy!r}.", f"choose one of {', '.join(NAMES)}.")
    return KINDS[strategy]


def compute_layout(
    strategy: str,
    nodes: int,
    gpus_per_node: int,
    cpus_per_gpu: int = 1,
    stages: Optional[int] = None,
    mesh: Optional[Tuple[int, ...]] = None,
    max_nodes: Optional[int] = None,
) -> JobLayout:
    """The layout of a strategy identity (hpc_train.contracts.strategy_table) on `nodes` nodes, or on any count from
    `nodes` to `max_nodes` (resources.nodes=MIN-MAX); ConfigError naming the key to change."""
    shape = known_kind(strategy)
    if not isinstance(nodes, int) or nodes < 1:
        raise ConfigError(
            "resources.nodes", f"must be a positive integer, got {nodes!r}.", "set resources.nodes=1 or more."
        )
    if max_nodes is not None:
        check_node_range(shape, nodes, max_nodes)
    if not isinstance(gpus_per_node, int) or gpus_per_node < 1:
        raise ConfigError(
            "resources.gpus_per_node",
            f"must be a positive integer, got {gpus_per_node!r}.",
            "set resources.gpus_per_node=1 or more.",
        )
    if nodes > 1 and not shape.multi_node:
        raise ConfigError(
            "resources.nodes",
            f"{shape.spelling} runs inside one node, but resources.nodes={nodes}.",
            shape.multi_node_hint + ".",
        )
    if shape.single_gpu:
        tasks, gpus_node, gpus_task = 1, 1, 1
    elif shape.one_task_per_gpu:
        tasks, gpus_node, gpus_task = gpus_per_node, gpus_per_node, 1
    elif shape.gpus_per_task_from_stages:
        stages = stages or HYBRID_STAGES
        if gpus_per_node % stages != 0:
            raise ConfigError(
                "strategy.stages",
                f"hybrid gives each task {stages} GPUs, which does not divide resources.gpus_per_node={gpus_per_node}.",
                f"choose strategy.stages among the divisors of {gpus_per_node}, or change resources.gpus_per_node to a"
                f" multiple of {stages}.",
            )
        tasks, gpus_node, gpus_task = gpus_per_node // stages, gpus_per_node, stages
    else:
        tasks, gpus_node, gpus_task = 1, gpus_per_node, gpus_per_node
    return JobLayout(
        strategy=strategy,
        nodes=nodes,
        tasks_per_node=tasks,
        gpus_per_node=gpus_node,
        gpus_per_task=gpus_task,
        cpus_per_task=max(1, cpus_per_gpu * gpus_task),
        mesh=mesh if shape.sharded else None,
        max_nodes=max_nodes,
    )


def check_node_range(shape: StrategyKind, nodes: int, max_nodes: int) -> None:
    """A range of nodes only for the strategies whose checkpoints resume at another world size (ddp's single file,
    the sharded ones' DCP directories): a job requeued onto another count continues from its checkpoint."""
    if shape.any_world or shape.sharded:
        return
    raise ConfigError(
        "resources.nodes",
        f"{shape.spelling} resumes its checkpoints only at the world size that wrote them, so it needs a fixed node"
        f" count, but resources.nodes={nodes}-{max_nodes} lets Slurm choose one.",
        f"set resources.nodes=N (e.g. resources.nodes={nodes if shape.multi_node else 1}), or use strategy=ddp, fsdp"
        " or mesh, whose checkpoints resume at any node count.",
    )
