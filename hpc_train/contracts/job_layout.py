"""The job layout, the one record of a job's shape that the launch side writes and every rank reads (no torch)."""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any, Mapping, Optional, Tuple

from hpc_train.contracts.mesh_dims import MeshDims


@dataclass(frozen=True)
class JobLayout:
    """The job's shape: its nodes, the tasks on each, their GPUs and CPUs, and a sharded strategy's dimensions.

    The launch side lays it out (hpc_train.launch.planning.layout.compute_layout) and writes it under the job spec's
    ``job.layout``, with the world size and the data-parallel size; every rank reads it back from there
    (hpc_train.compute.settings.JobSettings) and settles it on the nodes it got (compute/runtime/allocation.py)."""

    strategy: str
    nodes: int
    tasks_per_node: int
    gpus_per_node: int
    gpus_per_task: int
    cpus_per_task: int
    # fsdp: (replicas, shards), replicas > 1 is HSDP; mesh: hpc_train.contracts.mesh_dims.ORDER
    mesh: Optional[Tuple[int, ...]] = None
    # resources.nodes=MIN-MAX: `nodes` is MIN, the layout's numbers (world size, mesh) are MIN's, and Slurm may give
    # up to max_nodes; the ranks settle on the count they got (compute/runtime/allocation.py). None: a fixed count.
    max_nodes: Optional[int] = None
    # Ranks that split each global batch (a pipelining engine's stages share one shard): resolved with the parallelism
    # (launch/planning/parallelism.py) and written beside the layout in the job spec, which the ranks read it from.
    data_parallel_size: Optional[int] = None

    @property
    def world_size(self) -> int:
        """The world at `nodes` (a range's least)."""
        return self.nodes * self.tasks_per_node

    @property
    def stages(self) -> int:
        """The pipeline stages its ranks run (1 without): mesh's pp, or the pipelining engine's ranks over its
        data-parallel replicas."""
        if self.strategy == "mesh" and self.mesh is not None:
            return MeshDims(*self.mesh).pp
        if self.strategy == "pipelining":
            replicas = self.world_size if self.data_parallel_size is None else int(self.data_parallel_size)
            return max(1, self.world_size // replicas)
        return 1

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> "JobLayout":
        """The layout a job spec holds (``job.layout``: these fields and the world size, which is computed)."""
        known = {f.name for f in fields(cls)}
        values = {key: value for key, value in record.items() if key in known}
        mesh = values.get("mesh")
        return cls(**{**values, "mesh": None if mesh is None else tuple(mesh)})

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
        """How fsdp shards the parameters, or mesh's dimensions, for the describe() line ("" for the other
        strategies)."""
        if self.mesh is None:
            return ""
        at = f" at {self.nodes} nodes, resolved again for the nodes Slurm gives" if self.max_nodes else ""
        if self.strategy == "mesh":
            return f", {MeshDims(*self.mesh).describe()}{at}"
        replicas, shards = self.mesh
        if replicas == 1:
            return f", parameters sharded over {shards} ranks{at}"
        return f", HSDP: {replicas} replicas x {shards} shards{at}"


def group_layout(layout: JobLayout, groups: int) -> JobLayout:
    """The layout of one of `groups` replica groups of `layout` (fault_tolerance.replica_groups): whole nodes each
    when the job has a node per group or more, else a share of the one node's tasks. Inside a group the data-parallel
    replicas are the group's own: fsdp's and mesh's replicate dimension (the groups) becomes 1."""
    if groups <= 1:
        return layout
    if layout.nodes >= groups:
        nodes, tasks = layout.nodes // groups, layout.tasks_per_node
    else:
        nodes, tasks = layout.nodes, layout.tasks_per_node // groups
    mesh = layout.mesh
    if mesh is not None and layout.strategy == "fsdp":
        mesh = (1, nodes * tasks)
    elif mesh is not None and layout.strategy == "mesh":
        pp, replicate, shard, tp = mesh
        mesh = (pp, max(1, replicate // groups), shard, tp) if replicate >= groups else (pp, 1, shard // groups, tp)
    data_parallel = None if layout.data_parallel_size is None else max(1, int(layout.data_parallel_size) // groups)
    return replace(layout, nodes=nodes, tasks_per_node=tasks, mesh=mesh, data_parallel_size=data_parallel)
