"""A job's parallel dimensions, resolved and validated once (as torchtitan's ``ParallelDims``).

``strategy.*`` (stages, split points, micro-batches, balance, schedule, replicas) and the
resources (nodes, GPUs per node) decide together how the job is laid out and how the model and
the batch are cut. :func:`resolve_parallelism` reads them once, checks that they agree, and
returns one frozen :class:`Parallelism`; the layout, the cross-key checks (``validate.py``), the
sbatch parameters and the job spec all read that object instead of the raw config.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, List, Optional, Sequence, Tuple

from hpc_train.config.errors import ConfigError
from hpc_train.config.strategy import micro_batches, strategy_id
from hpc_train.contracts.mesh_dims import MeshDims, resolve_mesh_dims, torch_refusal, torch_too_old
from hpc_train.contracts.strategy_table import (
    KINDS,
    SplitSettings,
    StrategyKind,
    fsdp_mesh,
    mesh_split_settings,
    split_settings,
)
from hpc_train.launch.planning.layout import JobLayout, check_node_range, compute_layout, known_kind


@dataclass(frozen=True)
class Parallelism:
    layout: JobLayout
    split: Optional[SplitSettings]  # the strategies that cut the model; None for the others
    stages: Optional[int]  # stages each pipeline runs: declared, else one per GPU of a task (of a node: pipelining)
    data_parallel_size: int  # ranks that split each global batch (a pipelining engine's stages share one shard)

    @property
    def kind(self) -> StrategyKind:
        return KINDS[self.layout.strategy]

    @property
    def dims(self) -> Optional[MeshDims]:
        """A mesh job's dimensions (None for the other strategies)."""
        return MeshDims(*self.layout.mesh) if self.layout.strategy == "mesh" and self.layout.mesh else None

    @property
    def stage_ranks(self) -> bool:
        """One rank a pipeline stage (the pipelining engine, or a mesh with pp > 1): the schedule owns the step."""
        return self.layout.strategy == "pipelining" or (self.dims is not None and self.dims.pp > 1)

    @property
    def chunks(self) -> int:
        """Micro-batches each data-parallel rank cuts its batch into (1 without a split strategy)."""
        return self.split.chunks if self.split is not None else micro_batches(None)


def resolve_parallelism(
    strategy: Any, nodes: int, gpus_per_node: int, cpus_per_gpu: int, local: bool, max_nodes: Optional[int] = None
) -> Parallelism:
    """The strategy's settings, its layout and the sizes derived from them; ConfigError naming the key to change.

    ``local``: stages may share a device on purpose on this machine (a laptop, a CPU); on a
    cluster the GPUs are asked for, and fewer GPUs than stages would time-share one.
    ``max_nodes``: resources.nodes=MIN-MAX, MIN being `nodes`: the sizes are MIN's and the layout carries MAX
    (:func:`resolve_node_range` checks every count first).
    """
    kind_id = strategy_id(strategy)
    kind = known_kind(kind_id)
    if kind_id == "mesh":
        return _resolve_mesh(strategy, nodes, gpus_per_node, cpus_per_gpu, max_nodes)
    split = split_settings(strategy) if kind.staged else None
    if split is not None:
        _check_split_points(strategy, split)
    layout = compute_layout(
        strategy=kind_id,
        nodes=nodes,
        gpus_per_node=gpus_per_node,
        cpus_per_gpu=cpus_per_gpu,
        stages=split.stages if split is not None else None,
        mesh=_checked_mesh(strategy, nodes, gpus_per_node) if kind.sharded else None,
        max_nodes=max_nodes,
    )
    if split is None:
        return Parallelism(layout, None, None, layout.world_size)
    stages = split.stages or (layout.gpus_per_node if kind_id == "pipelining" else layout.gpus_per_task)
    if kind_id == "pipelining":
        if layout.world_size % stages:
            raise ConfigError(
                "strategy.stages",
                f"{layout.world_size} ranks cannot form pipelines of {stages} stages.",
                f"choose strategy.stages dividing {layout.world_size} (nodes x gpus_per_node).",
            )
        if split.schedule == "1f1b" and split.chunks < stages:
            raise ConfigError(
                "strategy.chunks",
                f"the 1F1B schedule needs at least as many micro-batches as stages ({stages}).",
                f"set strategy.chunks={stages} or more, or strategy.schedule=gpipe.",
            )
    elif not local and stages > layout.gpus_per_task:
        raise ConfigError(
            "strategy.stages",
            f"{stages} stages on {layout.gpus_per_task} GPUs per task would put two stages on one GPU.",
            f"set resources.gpus_per_node={stages}, or strategy.stages={layout.gpus_per_task} (null: one stage per"
            " GPU).",
        )
    # How many layers a model has is known only once it is built: the job checks that (and the
    # split points' names) at its start, before any training.
    if not isinstance(split.balance, str) and len(split.balance) != stages:
        raise ConfigError(
            "strategy.balance",
            f"{split.balance} must list {stages} positive layer counts, one per stage.",
            f"give {stages} positive numbers (layers per stage), or use strategy.balance=params.",
        )
    data_parallel = max(1, layout.world_size // stages) if kind_id == "pipelining" else layout.world_size
    return Parallelism(layout, split, stages, data_parallel)


def resolve_node_range(
    strategy: Any,
    nodes: int,
    max_nodes: int,
    gpus_per_node: int,
    cpus_per_gpu: int,
    local: bool,
    check: Callable[[Parallelism, Sequence[Parallelism]], None],
) -> Parallelism:
    """resources.nodes=MIN-MAX: the parallelism at MIN, its layout carrying MAX, once every count from MIN to MAX
    resolved and passed `check` (the cross-key checks that read the layout: a batch that splits over 2 and 4 ranks
    may not split over 3), which is given each count's parallelism and every count's. A refusal names the count that
    failed, and the narrower range that works."""
    check_node_range(known_kind(strategy_id(strategy)), nodes, max_nodes)
    every: List[Parallelism] = []
    for count in range(nodes, max_nodes + 1):
        try:
            every.append(resolve_parallelism(strategy, count, gpus_per_node, cpus_per_gpu, local))
        except ConfigError as err:
            raise _at_node_count(err, count, nodes, max_nodes) from None
    for count, parallel in zip(range(nodes, max_nodes + 1), every):
        try:
            check(parallel, every)
        except ConfigError as err:
            raise _at_node_count(err, count, nodes, max_nodes) from None
    return resolve_parallelism(strategy, nodes, gpus_per_node, cpus_per_gpu, local, max_nodes=max_nodes)


def _at_node_count(err: ConfigError, count: int, nodes: int, max_nodes: int) -> ConfigError:
    """`err`, found at `count` nodes of resources.nodes=nodes-max_nodes: said so, with the counts before it as a fix."""
    works = f"resources.nodes={nodes}-{count - 1}" if count - 1 > nodes else f"resources.nodes={nodes}"
    narrower = f"; or narrow the range to the counts that work, e.g. {works}" if count > nodes else ""
    return ConfigError(
        err.key,
        f"with {count} nodes, which resources.nodes={nodes}-{max_nodes} lets Slurm give the job: {err.problem}",
        f"{err.fix.rstrip('.')} (every node count from {nodes} to {max_nodes} must work){narrower}.",
    )


def _check_split_points(strategy: Any, split: SplitSettings, stages_key: str = "strategy.stages") -> None:
    """split_points fix the stages; a strategy.stages (mesh: strategy.pp) or strategy.balance that says otherwise is
    refused."""
    points = split.split_points
    if not points:
        return
    if len(set(points)) != len(points):
        raise ConfigError(
            "strategy.split_points", f"{points} names a module twice.", "name each module where a stage begins once."
        )
    stages = strategy.get(stages_key.split(".")[1])
    if stages is not None and stages != len(points) + 1:
        null = " (null)" if stages_key == "strategy.stages" else ""
        raise ConfigError(
            stages_key,
            f"is {stages}, but strategy.split_points={points} makes {len(points) + 1} stages.",
            f"set {stages_key}={len(points) + 1}, or give {stages - 1} split points"
            + (f", or drop {stages_key}{null}." if null else "."),
        )
    if split.balance != "params":
        raise ConfigError(
            "strategy.balance",
            f"is {split.balance!r}, but strategy.split_points already fixes where the stages begin.",
            "drop strategy.balance (params, the default, is ignored with split points), or drop strategy.split_points.",
        )


def _checked_mesh(strategy: Any, nodes: int, tasks_per_node: int) -> Tuple[int, int]:
    """fsdp's (replicas, shards): strategy.replicate must split the W ranks into equal replicas."""
    world = nodes * tasks_per_node
    replicas, shards = fsdp_mesh(strategy, nodes, tasks_per_node)
    if replicas < 1 or world % replicas:
        raise ConfigError(
            "strategy.replicate",
            f"{strategy.get('replicate', 1)} replicas do not divide the {world} ranks ({nodes} node"
            f"{'s' if nodes != 1 else ''} x {tasks_per_node} GPUs).",
            f"use strategy.replicate=nodes (HSDP: shard inside each node), 1 (shard over all ranks), or a divisor of"
            f" {world}.",
        )
    return replicas, shards


def _resolve_mesh(
    strategy: Any, nodes: int, gpus_per_node: int, cpus_per_gpu: int, max_nodes: Optional[int] = None
) -> Parallelism:
    """strategy=mesh: one rank per GPU, the dimensions resolved once (hpc_train.contracts.mesh_dims), the pipeline's
    settings
    when pp > 1; ConfigError naming the key for what the config alone shows (the model's own limits wait for the
    ranks: heads or widths tp does not divide, fewer blocks than stages, a plan pattern matching nothing)."""
    _check_torch_for_mesh()
    base = compute_layout(strategy="mesh", nodes=nodes, gpus_per_node=gpus_per_node, cpus_per_gpu=cpus_per_gpu)
    dims = resolve_mesh_dims(strategy, base.world_size, base.tasks_per_node)
    layout = compute_layout(
        strategy="mesh",
        nodes=nodes,
        gpus_per_node=gpus_per_node,
        cpus_per_gpu=cpus_per_gpu,
        mesh=dims.shape,
        max_nodes=max_nodes,
    )
    if dims.tp > 1 and not strategy.get("tp_plan"):
        raise ConfigError(
            "strategy.tp_plan",
            f"strategy.tp={dims.tp} cuts modules across ranks, but no plan says which.",
            "give strategy.tp_plan in your strategy option (defaults: [mesh, _self_], then tp_plan:"
            ' {"layers.*.attn.wq":'
            " colwise, ...}), or set strategy.tp=1.",
        )
    if dims.pp == 1:
        return Parallelism(layout, None, None, dims.data_parallel_size)
    split = mesh_split_settings(strategy, dims.pp)
    _check_split_points(strategy, split, stages_key="strategy.pp")
    if split.schedule == "1f1b" and split.chunks < dims.pp:
        raise ConfigError(
            "strategy.chunks",
            f"the 1F1B schedule needs at least as many micro-batches as stages (strategy.pp={dims.pp}).",
            f"set strategy.chunks={dims.pp} or more, or strategy.schedule=gpipe.",
        )
    if not isinstance(split.balance, str) and len(split.balance) != dims.pp:
        raise ConfigError(
            "strategy.balance",
            f"{split.balance} must list {dims.pp} positive layer counts, one per stage (strategy.pp={dims.pp}).",
            f"give {dims.pp} positive numbers (layers per stage), or use strategy.balance=params.",
        )
    return Parallelism(layout, split, dims.pp, dims.data_parallel_size)


def _check_torch_for_mesh() -> None:
    """The login node's torch, read without importing it (ranks check their own at start)."""
    from importlib import metadata  # a few ms, only for strategy=mesh

    try:
        version = metadata.version("torch")
    except metadata.PackageNotFoundError:  # a login environment without torch: the ranks check theirs
        return
    if torch_too_old(version):
        raise torch_refusal(version)
