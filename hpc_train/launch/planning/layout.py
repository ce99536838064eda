"""The job layout of a strategy: what Slurm must allocate and how the processes use it.

The shapes themselves (one task per GPU, GPUs per task from the stages, single node...) are
declared once, per strategy identity, in :mod:`hpc_train.contracts.strategy_table`; this module turns
one into numbers. The Slurm renderer, the local launcher and the validation all read layouts
from here, so a strategy's shape is never written twice.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Tuple

from hpc_train.config.errors import ConfigError
from hpc_train.config.strategy import HYBRID_STAGES, NAMES
from hpc_train.contracts.mesh_dims import MeshDims
from hpc_train.contracts.strategy_table import KINDS, StrategyKind


@dataclass(frozen=True)
class JobLayout:
    strategy: str
    nodes: int
    tasks_per_node: int
    gpus_per_node: int
    gpus_per_task: int
    cpus_per_task: int
    mesh: Optional[Tuple[int, ...]] = (
        None  # fsdp: (replicas, shards), replicas > 1 is HSDP; mesh: hpc_train.contracts.mesh_dims.ORDER
    )
    # resources.nodes=MIN-MAX: `nodes` is MIN, the layout's numbers (world size, mesh) are MIN's, and Slurm may give
    # up to max_nodes; the ranks settle on the count they got (compute/runtime/allocation.py). None: a fixed count.
    max_nodes: Optional[int] = None

    @property
    def world_size(self) -> int:
        """The world at `nodes` (a range's least)."""
        return self.nodes * self.tasks_per_node

    @property
    def node_counts(self) -> range:
        """Every node count the job may run on (one for a fixed count)."""
        return range(self.nodes, (self.max_nodes or self.nodes) + 1)

    @property
    def nodes_text(self) -> str:
        """resources.nodes as Slurm's --nodes spells it: ``2``, or ``2-4`` for a range."""
        return f"{self.nodes}-{self.max_nodes}" if self.max_nodes else str(self.nodes)

    @property
    def label(self) -> str:
        """The strategy as users name it (`pipeline (engine=pipelining)` for the distributed pipeline)."""
        return "pipeline (engine=pipelining)" if self.strategy == "pipelining" else self.strategy

    def describe(self, on_cpus: bool = False) -> str:
        """One line for people; `on_cpus`: a machine without GPUs, where every "GPU" is a CPU worker process."""
        node_word = "node" if self.nodes == 1 and not self.max_nodes else "nodes"
        task_word = "task" if self.tasks_per_node == 1 else "tasks"
        world = f"{self.world_size}-{self.max_nodes * self.tasks_per_node}" if self.max_nodes else str(self.world_size)
        head = (
            f"{self.label}: {self.nodes_text} {node_word} x {self.tasks_per_node} {task_word}/node (world size {world})"
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
        at = f" at {self.nodes} nodes, resolved again for the nodes Slurm gives" if self.max_nodes else ""
        if self.strategy == "mesh":
            return f", {MeshDims(*self.mesh).describe()}{at}"
        replicas, shards = self.mesh
        if replicas == 1:
            return f", parameters sharded over {shards} ranks{at}"
        return f", HSDP: {replicas} replicas x {shards} shards{at}"


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
    """The layout of a strategy identity (hpc_train.contracts.strategy_table) on `nodes` nodes, or on any count from `nodes` to
    `max_nodes` (resources.nodes=MIN-MAX); ConfigError naming the key to change."""
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
