"""The layouts a job could run with on its nodes and GPUs: each as the overrides to paste, checked by the project's
own layout rules (no torch).

:func:`layout_candidates` lists, for the job's world (nodes x GPUs per node, one rank per GPU): ``strategy=ddp``,
``strategy=fsdp``, HSDP (``strategy=fsdp strategy.replicate=nodes``, with more than one node) and the mesh's
products of tensor parallel (only where the mesh option has a ``tp_plan``; tp divides the GPUs per node) and
pipeline stages (dividing the world, with ``strategy.chunks`` of pp and 2 pp micro-batches), the rest of the world
FSDP shards (or, on several nodes, replicas of a node's shards too). Each is resolved by
:func:`~hpc_train.launch.planning.parallelism.resolve_parallelism` and checked by
:func:`~hpc_train.launch.planning.validate.check_layout` (the batch splits, the micro-batches fit the per-rank batch,
a step that calls the whole model is not staged): what either refuses is no candidate. Whether a candidate fits
in memory is the estimate's question (``python -m hpc_train.compute.fit``), which the caller asks.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from omegaconf import OmegaConf

from hpc_train.conf import CONFIG_DIR
from hpc_train.config.checks import count_range
from hpc_train.config.errors import ConfigError
from hpc_train.config.launcher import launcher_kind
from hpc_train.config.strategy import AUTO_SEARCH
from hpc_train.config.view import ConfigView
from hpc_train.contracts.mesh_dims import ORDER
from hpc_train.launch.planning.parallelism import Parallelism, resolve_parallelism
from hpc_train.launch.planning.plan import resolve_gpus_per_node
from hpc_train.launch.planning.validate import check_layout

SEARCH = AUTO_SEARCH  # the kinds of layout listed unless the caller narrows them


@dataclass(frozen=True)
class Candidate:
    """One layout: the overrides that select it (``strategy=mesh strategy.tp=2 ...``), in words, and its resolved
    parallel dimensions (what the cost model reads)."""

    overrides: Tuple[str, ...]
    words: str
    parallel: Optional[Parallelism] = field(default=None, compare=False)

    @property
    def text(self) -> str:
        """The overrides as typed on a command line."""
        return " ".join(self.overrides)


@dataclass(frozen=True)
class _World:
    nodes: int
    gpus_per_node: int
    cpus_per_gpu: int
    local: bool

    @property
    def size(self) -> int:
        return self.nodes * self.gpus_per_node


def layout_candidates(
    view: ConfigView,
    mesh: Optional[Tuple[str, Mapping[str, Any]]] = None,
    search: Sequence[str] = SEARCH,
) -> List[Candidate]:
    """The valid layouts for `view`'s nodes (the least of a range) and GPUs per node, of the kinds in `search`.

    `mesh`: (the strategy option the tensor-parallel and pipeline candidates select, its composed node, whose
    ``tp_plan`` and pipeline settings they keep); default: the job's own strategy when it is a mesh (its option
    named as Hydra chose it), else the shipped ``mesh`` (no tp_plan: no tensor-parallel candidates)."""
    world = _world_of(view)
    option, mesh_node = mesh if mesh is not None else _own_mesh(view)
    proposals = _data_parallel(world, search) + _mesh_products(world, option, mesh_node, search)
    found = []
    for overrides, node in proposals:
        parallel = _checked(view, node, world)
        if parallel is not None:
            found.append(Candidate(overrides, _words(parallel), parallel))
    return found


def shipped_strategy(name: str) -> Dict[str, Any]:
    """A shipped strategy option's node (conf/strategy/NAME.yaml) as plain data."""
    node = OmegaConf.to_container(OmegaConf.load(Path(CONFIG_DIR) / "strategy" / f"{name}.yaml"), resolve=True)
    assert isinstance(node, dict)
    return {str(key): value for key, value in node.items() if key != "defaults"}


def _world_of(view: ConfigView) -> _World:
    nodes, _ = count_range(view.resources.nodes)
    cpus = view.cluster.get("cpus_per_gpu")
    return _World(
        nodes, resolve_gpus_per_node(view), int(cpus) if cpus else 1, launcher_kind(view.launcher.name).on_this_machine
    )


def _own_mesh(view: ConfigView) -> Tuple[str, Mapping[str, Any]]:
    """The job's strategy option when it is a mesh (its tp_plan kept), else the shipped mesh."""
    if str(view.strategy.get("name")) != "mesh":
        return "mesh", shipped_strategy("mesh")
    from hpc_train.launch.planning.jobspec import hydra_choices  # Hydra's state: read only for a mesh job

    return hydra_choices().get("strategy", "mesh"), view.plain()["strategy"]


Proposal = Tuple[Tuple[str, ...], Dict[str, Any]]


def _data_parallel(world: _World, search: Sequence[str]) -> List[Proposal]:
    """ddp, fsdp over every rank, and HSDP (shards inside a node, replicas across nodes) on several nodes."""
    found: List[Proposal] = []
    if "ddp" in search:
        found.append((("strategy=ddp",), shipped_strategy("ddp")))
    if "fsdp" in search:
        found.append((("strategy=fsdp",), shipped_strategy("fsdp")))
    if "hsdp" in search and world.nodes > 1:
        hsdp = {**shipped_strategy("fsdp"), "replicate": "nodes"}
        found.append((("strategy=fsdp", "strategy.replicate=nodes"), hsdp))
    return found


def _mesh_products(world: _World, option: str, node: Mapping[str, Any], search: Sequence[str]) -> List[Proposal]:
    """The mesh's tp x pp products (one of them above 1), the rest of the world FSDP shards, or on several nodes
    replicas of shards too; pipelines with pp and 2 pp micro-batches."""
    tps = [t for t in _divisors(world.gpus_per_node) if t == 1 or ("tp" in search and node.get("tp_plan"))]
    pps = [p for p in _divisors(world.size) if p == 1 or "pp" in search]
    found: List[Proposal] = []
    for pp in pps:
        for tp in tps:
            if tp * pp == 1 or world.size % (tp * pp):
                continue
            rest = world.size // (tp * pp)
            replicas = [1] + ([world.nodes] if "hsdp" in search and world.nodes > 1 and rest % world.nodes == 0 else [])
            for dp_replicate in replicas:
                dims = {"pp": pp, "dp_replicate": dp_replicate, "dp_shard": rest // dp_replicate, "tp": tp}
                for chunks in [pp, 2 * pp] if pp > 1 else [None]:
                    found.append(_mesh_proposal(option, node, dims, chunks))
    return found


def _mesh_proposal(option: str, node: Mapping[str, Any], dims: Dict[str, int], chunks: Optional[int]) -> Proposal:
    """The overrides of one mesh layout: the option, then its dimensions (the shards as -1, whatever the world
    leaves, without replicas) and chunks; for the shipped mesh only those that differ from its defaults (a user's
    option may set its own, e.g. tp: 2)."""
    settings: Dict[str, Any] = {**dims, **({"chunks": chunks} if chunks is not None else {})}
    if settings["dp_replicate"] == 1:
        settings["dp_shard"] = -1
    shipped = shipped_strategy("mesh") if option == "mesh" else {}
    changed = [f"strategy.{key}={value}" for key, value in settings.items() if shipped.get(key) != value]
    return (f"strategy={option}", *changed), {**dict(node), **settings}


def _checked(view: ConfigView, node: Dict[str, Any], world: _World) -> Optional[Parallelism]:
    """The candidate's parallelism when the project's layout rules accept it with this job's settings, else None."""
    try:
        parallel = resolve_parallelism(
            ConfigView(node), world.nodes, world.gpus_per_node, world.cpus_per_gpu, world.local
        )
        check_layout(ConfigView({**view.plain(), "strategy": node}), parallel)
    except ConfigError:
        return None
    return parallel


def _words(parallel: Parallelism) -> str:
    """e.g. ``ddp x 8``, ``fsdp 8``, ``hsdp 2 x 4``, ``tp 2 x dp_shard 4``, ``pp 2 x dp_shard 4, 4 chunks``."""
    layout = parallel.layout
    if parallel.dims is not None:
        dims = parallel.dims
        text = " x ".join(f"{dim} {getattr(dims, dim)}" for dim in ORDER if getattr(dims, dim) > 1) or "one rank"
        return text + (f", {parallel.chunks} chunks" if dims.pp > 1 else "")
    if layout.strategy == "fsdp" and layout.mesh is not None and layout.mesh[0] > 1:
        return f"hsdp {layout.mesh[0]} x {layout.mesh[1]}"
    return f"{layout.strategy} x {layout.world_size}" if layout.strategy == "ddp" else f"fsdp {layout.world_size}"


def _divisors(count: int) -> List[int]:
    return [d for d in range(1, count + 1) if count % d == 0]
