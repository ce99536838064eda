"""Parallel strategies, one module per strategy, looked up by its identity (hpc_train.strategy_table); the staged model (stages)."""

from __future__ import annotations

from typing import Callable, Dict, List, Optional, Sequence, Type

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


def build_strategy(
    cfg,
    ranks: RankInfo,
    devices: List[torch.device],
    precision: str,
    loss_fn: Optional[Callable] = None,
    step: Optional[Callable] = None,
    metric_names: Sequence[str] = (),
    compile_blocks: bool = False,
) -> Strategy:
    """The strategy `cfg` (the strategy node) names, complete: without a step, it runs the built-in step of
    `loss_fn` (cross-entropy by default); :meth:`Strategy.with_step` gives the same placement another step."""
    identity = strategy_id(cfg)
    if identity == "pipelining":  # imported on demand: torch.distributed.pipelining is heavy
        from hpc_train.compute.parallel.pipelining import PipeliningStrategy

        cls: Type[Strategy] = PipeliningStrategy
    else:
        cls = STRATEGIES[identity]
    return cls(cfg, ranks, devices, precision, loss_fn, step, metric_names, compile_blocks)
