"""Strategy registry: one module per strategy, looked up by its identity (hpc_train.strategy_table)."""

from __future__ import annotations

from typing import Callable, Dict, List, Optional, Type

import torch

from hpc_train.compute.ranks import RankInfo
from hpc_train.compute.strategies.base import Strategy
from hpc_train.compute.strategies.ddp import DDPStrategy
from hpc_train.compute.strategies.dp import DataParallelStrategy
from hpc_train.compute.strategies.fsdp import FSDPStrategy
from hpc_train.compute.strategies.hybrid import HybridStrategy
from hpc_train.compute.strategies.model_parallel import ModelParallelStrategy
from hpc_train.compute.strategies.pipeline import PipelineStrategy
from hpc_train.compute.strategies.single import SingleStrategy
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
    cfg, ranks: RankInfo, devices: List[torch.device], precision: str, loss_fn: Optional[Callable] = None
) -> Strategy:
    identity = strategy_id(cfg)
    if identity == "pipelining":  # imported on demand: torch.distributed.pipelining is heavy
        from hpc_train.compute.strategies.pipelining import PipeliningStrategy

        return PipeliningStrategy(cfg, ranks, devices, precision, loss_fn)
    return STRATEGIES[identity](cfg, ranks, devices, precision, loss_fn)
