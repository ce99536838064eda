"""Parallel strategies, one module per strategy, looked up by its identity (hpc_train.strategy_table); the staged model (stages)."""

from __future__ import annotations

from typing import Callable, Dict, List, Optional, Sequence, Tuple, Type

import torch

from hpc_train.compute.runtime.ranks import RankInfo
from hpc_train.compute.parallel.base import Strategy
from hpc_train.compute.parallel.ddp import DDPStrategy
from hpc_train.compute.parallel.dp import DataParallelStrategy
from hpc_train.compute.parallel.fsdp import FSDPStrategy
from hpc_train.compute.parallel.hybrid import HybridStrategy
from hpc_train.compute.parallel.model_parallel import ModelParallelStrategy
from hpc_train.compute.parallel.pipeline import PipelineStrategy
from hpc_train.compute.parallel.single import SingleStrategy
from hpc_train.strategy_table import strategy_id

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
    )
}


def rank_data_shard(layout, ranks: RankInfo) -> Tuple[int, int]:
    """(this rank's data shard, number of shards) from the job's layout, before any strategy exists.

    The launch side declared ``data_parallel_size`` D; the ranks of one model replica are consecutive
    (a pipelining engine's S = W / D stages; one rank per replica elsewhere), so rank r reads shard
    r // (W / D). The trainer needs its data, then one batch through the user's step, before it can
    build the strategy that runs that step; the strategy then checks it agrees (:func:`build_strategy`).
    """
    shards = int(layout.data_parallel_size)
    return ranks.rank // max(1, ranks.world_size // shards), shards


def build_strategy(
    cfg,
    ranks: RankInfo,
    devices: List[torch.device],
    precision: str,
    loss_fn: Optional[Callable] = None,
    step: Optional[Callable] = None,
    metric_names: Sequence[str] = (),
    compile_blocks: bool = False,
    shard: Optional[Tuple[int, int]] = None,
) -> Strategy:
    """The strategy `cfg` (the strategy node) names, complete: without a step, it runs the built-in step of
    `loss_fn` (cross-entropy by default). `shard`: the data shard already read (:func:`rank_data_shard`), which
    the strategy's own placement must agree with."""
    identity = strategy_id(cfg)
    if identity == "pipelining":
        # heavy: torch.distributed.pipelining costs ~1.4 s to import, only pipelining runs pay it
        from hpc_train.compute.parallel.pipelining import PipeliningStrategy

        cls: Type[Strategy] = PipeliningStrategy
    else:
        cls = STRATEGIES[identity]
    strategy = cls(cfg, ranks, devices, precision, loss_fn, step, metric_names, compile_blocks)
    placed = (strategy.data_parallel_rank, strategy.data_parallel_size)
    if shard is not None and placed != tuple(shard):
        raise RuntimeError(
            f"hpc_train bug: rank {ranks.rank} read data shard {shard[0]} of {shard[1]} (the job's layout) but the"
            f" {strategy.name} strategy places it in shard {placed[0]} of {placed[1]}"
        )
    return strategy
