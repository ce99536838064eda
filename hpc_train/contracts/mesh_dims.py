"""The dimensions of a ``mesh`` job: data replicas x FSDP shards x tensor parallel x pipeline stages, validated once.

As torchtitan's ``ParallelDims``: one frozen object, resolved from ``strategy.dp_replicate``,
``strategy.dp_shard`` (-1: whatever the world leaves), ``strategy.tp`` and ``strategy.pp`` and the
job's world (nodes x GPUs per node, one rank per GPU), read by the login side (layout, batch
checks, the dry run) and by every rank (its coordinates, its data shard, its device mesh). No torch.

The ranks are laid out in :data:`ORDER`, pipeline stages outermost and tensor parallel innermost:
a tensor-parallel group is ``tp`` consecutive ranks, so it stays inside a node (``tp`` divides the
GPUs per node), and the stages of one pipeline are ``world / pp`` ranks apart, across nodes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, Tuple

from hpc_train.config.errors import ConfigError

ORDER = ("pp", "dp_replicate", "dp_shard", "tp")  # outermost first, as the ranks are numbered
KEYS = {dim: f"strategy.{dim}" for dim in ORDER}
TORCH_NEEDED = (2, 6)  # fully_shard public, get_total_norm / clip_grads_with_norm_, pipelining shape inference


@dataclass(frozen=True)
class MeshDims:
    pp: int
    dp_replicate: int
    dp_shard: int
    tp: int

    @property
    def shape(self) -> Tuple[int, int, int, int]:
        return tuple(getattr(self, dim) for dim in ORDER)  # type: ignore[return-value]

    @property
    def world_size(self) -> int:
        return self.pp * self.dp_replicate * self.dp_shard * self.tp

    @property
    def data_parallel_size(self) -> int:
        """Ranks that split the global batch: the replicas times the shards (a tp group and a pipeline share one)."""
        return self.dp_replicate * self.dp_shard

    def coordinates(self, rank: int) -> Dict[str, int]:
        """Where `rank` sits on each dimension."""
        place: Dict[str, int] = {}
        for dim in reversed(ORDER):
            size = getattr(self, dim)
            place[dim] = rank % size
            rank //= size
        return {dim: place[dim] for dim in ORDER}

    def data_shard(self, rank: int) -> Tuple[int, int]:
        """(the data shard `rank` reads, the number of shards): its data-parallel coordinate."""
        at = self.coordinates(rank)
        return at["dp_replicate"] * self.dp_shard + at["dp_shard"], self.data_parallel_size

    def describe(self) -> str:
        """e.g. ``pp 2 x dp_shard 2 x tp 2``: the dimensions above 1 (``one rank`` when none is)."""
        parts = [f"{dim} {getattr(self, dim)}" for dim in ORDER if getattr(self, dim) > 1]
        return " x ".join(parts) or "one rank"


def resolve_mesh_dims(strategy: Any, world: int, tasks_per_node: int) -> MeshDims:
    """The job's dimensions from the strategy node (values already checked one by one) and its world; ConfigError
    naming the key and the fix when they do not agree: the product, -1's remainder, tp inside a node."""
    fixed = {dim: int(strategy.get(dim)) for dim in ("pp", "dp_replicate", "tp")}
    shard = int(strategy.get("dp_shard"))
    others = fixed["pp"] * fixed["dp_replicate"] * fixed["tp"]
    where = f"the world of {world} ranks (nodes x gpus_per_node, one rank per GPU)"
    if shard == -1:
        if world % others:
            raise ConfigError(
                KEYS["dp_shard"],
                f"-1 takes what the world leaves, but pp x dp_replicate x tp = {others} does not divide {where}.",
                f"choose strategy.pp, strategy.dp_replicate and strategy.tp whose product divides {world}, or change"
                " resources.nodes / resources.gpus_per_node.",
            )
        shard = world // others
    dims = MeshDims(dp_shard=shard, **fixed)
    if dims.world_size != world:
        raise ConfigError(
            KEYS["dp_shard"],
            f"pp x dp_replicate x dp_shard x tp = {' x '.join(str(n) for n in dims.shape)} = {dims.world_size} ranks,"
            f" but the job has {where}.",
            "set strategy.dp_shard=-1 (whatever the world leaves), or resources.nodes x resources.gpus_per_node ="
            f" {dims.world_size}.",
        )
    if tasks_per_node % dims.tp:
        raise ConfigError(
            KEYS["tp"],
            f"tensor parallel stays inside a node, but tp={dims.tp} does not divide the {tasks_per_node} GPUs per"
            " node.",
            f"choose strategy.tp among the divisors of {tasks_per_node}, or change resources.gpus_per_node.",
        )
    return dims


def torch_too_old(version: str) -> bool:
    """True when `version` (``torch.__version__``'s text) is older than the mesh strategy needs."""
    numbers = []
    for part in version.split("+")[0].split(".")[:2]:
        digits = "".join(ch for ch in part if ch.isdigit())
        numbers.append(int(digits or 0))
    return tuple(numbers) < TORCH_NEEDED


def torch_refusal(version: str) -> ConfigError:
    needed = ".".join(str(n) for n in TORCH_NEEDED)
    return ConfigError(
        "strategy",
        f"strategy=mesh needs torch >= {needed} (public fully_shard, DTensor gradient norms), this environment has"
        f" torch {version}.",
        f"install torch>={needed}, or use strategy=fsdp / ddp / pipeline, which run on older torch.",
    )
