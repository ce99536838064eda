"""Strategy registry: one module per strategy, looked up by `strategy.name`."""

from __future__ import annotations

from typing import Dict, List, Type

import torch

from hpc_train.compute.ranks import RankInfo
from hpc_train.compute.strategies.base import Strategy
from hpc_train.compute.strategies.ddp import DDPStrategy
from hpc_train.compute.strategies.single import SingleStrategy

STRATEGIES: Dict[str, Type[Strategy]] = {cls.name: cls for cls in (SingleStrategy, DDPStrategy)}


def build_strategy(cfg, ranks: RankInfo, devices: List[torch.device], precision: str) -> Strategy:
    return STRATEGIES[cfg.name](cfg, ranks, devices, precision)
