"""The layout of the nodes a job got: a job planned for a range of nodes (``resources.nodes=2-4``) runs on the count
Slurm allocated, and everything a rank derives from the node count follows that count.

The login node checked every count of the range and wrote the layout of the least (``job.layout``, with its
``max_nodes``); Slurm starts the job on as many nodes as it can give, up to ``max_nodes``, with
``--ntasks-per-node`` tasks on each, so the step's task count (``SLURM_STEP_NUM_TASKS``, the rank's world) says how
many nodes it got. :func:`settle_layout` turns the planned layout into that count's: nodes, world size,
data-parallel size and the sharded strategies' dimensions (fsdp's replicas, HSDP's ``strategy.replicate=nodes``,
mesh's ``dp_shard=-1``), resolved by the same functions the login node used (``hpc_train.contracts.strategy_table``,
``hpc_train.contracts.mesh_dims``). Only ddp, fsdp and mesh may have a range (their checkpoints resume at another
world).

Pure Python (no torch), so it is tested without a process group.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Optional

from hpc_train.compute.runtime.ranks import RankInfo, world_mismatch
from hpc_train.contracts.job_layout import JobLayout
from hpc_train.contracts.mesh_dims import resolve_mesh_dims
from hpc_train.contracts.strategy_table import fsdp_mesh


def settle_layout(layout: JobLayout, strategy: Any, world: int) -> JobLayout:
    """`layout` at the node count a world of `world` ranks means; a fixed layout, or a world that is not one of the
    range's (refused by :func:`allocation_mismatch`), is returned as it is. `strategy` is the job spec's node."""
    if layout.max_nodes is None or world % layout.tasks_per_node:
        return layout
    nodes = world // layout.tasks_per_node
    if not layout.nodes <= nodes <= layout.max_nodes:
        return layout
    mesh, data_parallel = layout.mesh, world
    if layout.strategy == "mesh":
        dims = resolve_mesh_dims(strategy, world, layout.tasks_per_node)
        mesh, data_parallel = tuple(dims.shape), dims.data_parallel_size
    elif layout.strategy == "fsdp":
        mesh = tuple(fsdp_mesh(strategy, nodes, layout.tasks_per_node))
    return replace(layout, nodes=nodes, data_parallel_size=data_parallel, mesh=mesh)  # world_size: nodes x tasks


def allocation_mismatch(layout: JobLayout, ranks: RankInfo) -> Optional[str]:
    """Why this process cannot be a rank of the planned `layout` (its world, or any world of its range of nodes)."""
    if layout.max_nodes is None:
        return world_mismatch(ranks, int(layout.world_size))
    per_node = int(layout.tasks_per_node)
    return world_mismatch(ranks, int(layout.world_size), most=int(layout.max_nodes) * per_node, per_node=per_node)
