"""The job layout of a strategy: what Slurm must allocate and how the processes use it.

The shapes themselves (one task per GPU, GPUs per task from the stages, single node...) are
declared once, per strategy identity, in :mod:`hpc_train.strategy_table`; this module turns
one into numbers. The Slurm renderer, the local launcher and the validation all read layouts
from here, so a strategy's shape is never written twice.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Tuple

from hpc_train.config.errors import ConfigError
from hpc_train.config.strategy import HYBRID_STAGES, NAMES
from hpc_train.mesh_dims import MeshDims
from hpc_train.strategy_table import KINDS, StrategyKind


@dataclass(frozen=True)
class JobLayout:
    strategy: str
    nodes: int
    tasks_per_node: int
    gpus_per_node: int
    gpus_per_task: int
    cpus_per_task: int
    mesh: Optional[Tuple[int, ...]] = None  # fsdp: (replicas, shards), replicas > 1 is HSDP; mesh: hpc_train.mesh_dims.ORDER

    @property
    def world_size(self) -> int:
        return self.nodes * self.tasks_per_node

    @property
    def label(self) -> str:
        """The strategy as users name it (`pipeline (engine=pipelining)` for the distributed pipeline)."""
        return "pipeline (engine=pipelining)" if self.strategy == "pipelining" else self.strategy

    def describe(self, on_cpus: bool = False) -> str:
        """One line for people; `on_cpus`: a machine without GPUs, where every "GPU" is a CPU worker process."""
        node_word = "node" if self.nodes == 1 else "nodes"
        task_word = "task" if self.tasks_per_node == 1 else "tasks"
        head = (
            f"{self.label}: {self.nodes} {node_word} x {self.tasks_per_node} {task_word}/node (world size"
            f" {self.world_size})"
        )
        if on_cpus:
            workers = self.world_size
            stages = f", {self.gpus_per_task} stages each" if self.gpus_per_task > 1 else ""
            return f"{head}, {workers} CPU worker process{'es' if workers != 1 else ''}{stages} (no GPU){self.sharding}"
        return (
            f"{head}, {self.gpus_per_task} GPU/task, gpu:{self.gpus_per_node} per node, {self.cpus_per_task}"
            f" CPU/task{self.sharding}"
        )

    @property
    def sharding(self) -> str:
        """How fsdp shards the parameters, or mesh's dimensions, for the describe() line ("" for the other strategies)."""
        if self.mesh is None:
            return ""
        if self.strategy == "mesh":
            return f", {MeshDims(*self.mesh).describe()}"
        replicas, shards = self.mesh
        if replicas == 1:
            return f", parameters sharded over {shards} ranks"
        return f", HSDP: {replicas} replicas x {shards} shards"


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
) -> JobLayout:
    """The layout of a strategy identity (hpc_train.strategy_table); ConfigError naming the key to change."""
    shape = known_kind(strategy)
    if not isinstance(nodes, int) or nodes < 1:
        raise ConfigError(
            "resources.nodes", f"must be a positive integer, got {nodes!r}.", "set resources.nodes=1 or more."
        )
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
    )
