"""Strategy registry: one module per strategy, looked up by `strategy.name`."""

from __future__ import annotations

from typing import Callable, Dict, List, Optional, Type

import torch

from hpc_train.compute.ranks import RankInfo
from hpc_train.compute.strategies.base import Strategy
from hpc_train.compute.strategies.ddp import DDPStrategy
from hpc_train.compute.strategies.dp import DataParallelStrategy
from hpc_train.compute.strategies.hybrid import HybridStrategy
from hpc_train.compute.strategies.model_parallel import ModelParallelStrategy
from hpc_train.compute.strategies.pipeline import PipelineStrategy
from hpc_train.compute.strategies.single import SingleStrategy

STRATEGIES: Dict[str, Type[Strategy]] = {
    cls.name: cls for cls in (SingleStrategy, DDPStrategy, DataParallelStrategy, ModelParallelStrategy, PipelineStrategy, HybridStrategy)
}


def build_strategy(cfg, ranks: RankInfo, devices: List[torch.device], precision: str, loss_fn: Optional[Callable] = None) -> Strategy:
    if cfg.name == "pipeline" and cfg.get("engine") == "pipelining":
        from hpc_train.compute.strategies.pipelining import PipeliningStrategy

        return PipeliningStrategy(cfg, ranks, devices, precision, loss_fn)
    return STRATEGIES[cfg.name](cfg, ranks, devices, precision, loss_fn)
