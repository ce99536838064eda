"""Parallel strategies, one module per strategy, looked up by its identity (hpc_train.contracts.strategy_table); the
staged model (stages)."""

from __future__ import annotations

from typing import Dict, Tuple, Type

from hpc_train.compute.parallel.base import Strategy, StrategySetup
from hpc_train.compute.parallel.ddp import DDPStrategy
from hpc_train.compute.parallel.dp import DataParallelStrategy
from hpc_train.compute.parallel.fsdp import FSDPStrategy
from hpc_train.compute.parallel.hybrid import HybridStrategy
from hpc_train.compute.parallel.mesh import MeshStrategy
from hpc_train.compute.parallel.model_parallel import ModelParallelStrategy
from hpc_train.compute.parallel.pipeline import PipelineStrategy
from hpc_train.compute.parallel.single import SingleStrategy
from hpc_train.compute.runtime.ranks import RankInfo
from hpc_train.contracts.job_layout import JobLayout
from hpc_train.contracts.mesh_dims import MeshDims

STRATEGIES: Dict[str, Type[Strategy]] = {
    cls.name: cls
    for cls in (
        SingleStrategy,
        DDPStrategy,
        FSDPStrategy,
        DataParallelStrategy,
        ModelParallelStrategy,
        PipelineStrategy,
        HybridStrategy,
        MeshStrategy,
    )
}


def rank_data_shard(layout: JobLayout, ranks: RankInfo) -> Tuple[int, int]:
    """(this rank's data shard, number of shards) from the job's layout, before any strategy exists.

    The launch side declared ``data_parallel_size`` D; the ranks of one model replica are consecutive (a pipelining
    engine's S = W / D stages; one rank per replica elsewhere), so rank r reads shard r // (W / D); a mesh's
    data-parallel coordinate says it (hpc_train.contracts.mesh_dims). The trainer needs its data, then one batch
    through the user's step, before it can build the strategy that runs that step; the strategy then checks it
    agrees (:func:`build_strategy`).
    """
    if layout.strategy == "mesh":
        return MeshDims(*layout.mesh).data_shard(ranks.rank)
    shards = int(layout.data_parallel_size)
    return ranks.rank // max(1, ranks.world_size // shards), shards


def replica_shard(shard: Tuple[int, int], ranks: RankInfo) -> Tuple[int, int]:
    """A replica group's rank reads its share of the whole job's data: group g's shard d of D is shard g * D + d of
    groups * D, the data split as for plain data parallelism over every rank (`shard` itself without groups)."""
    return ranks.group * shard[1] + shard[0], ranks.groups * shard[1]


def strategy_class(identity: str) -> Type[Strategy]:
    """The Strategy class of a strategy identity (hpc_train.config.strategy.strategy_id); its ``settings_type`` is what
    it reads of the ``strategy`` section."""
    if identity == "pipelining":
        # heavy: torch.distributed.pipelining costs ~1.4 s to import, only pipelining runs pay it
        from hpc_train.compute.parallel.pipelining import PipeliningStrategy

        return PipeliningStrategy
    return STRATEGIES[identity]


def build_strategy(setup: StrategySetup, shard: Tuple[int, int]) -> Strategy:
    """The strategy `setup.settings` names, complete. `shard`: the data shard already read (:func:`rank_data_shard`),
    which the strategy's own placement must agree with."""
    strategy = strategy_class(setup.settings.identity)(setup)
    placed = (strategy.data_parallel_rank, strategy.data_parallel_size)
    if placed != tuple(shard):
        raise AssertionError(  # hpc_train's own invariant, not the user's input: a traceback is wanted
            f"hpc_train bug: rank {setup.ranks.rank} read data shard {shard[0]} of {shard[1]} (the job's layout) but"
            f" the {strategy.name} strategy places it in shard {placed[0]} of {placed[1]}"
        )
    return strategy
