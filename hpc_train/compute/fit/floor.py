"""The least a job's largest rank can hold, without simulating its step: what the whole job's model holds at its
optimizer's step (every parameter and buffer, a gradient per trainable parameter, the optimizer's state as its first
step makes it), shared evenly over the ranks that split it.

It is a lower bound of the estimate's peak (:mod:`hpc_train.compute.fit.estimate`): at the optimizer's step every
rank holds its parameters, their gradients and their state at once; a strategy that replicates the model (one
process, ``ddp``) holds all of them on each rank, and one that splits it (FSDP shards, tensor-parallel slices,
pipeline stages) holds on its largest rank at least the average share, padding and replicated pieces only adding.
A job whose floor does not fit will not fit, and is known after building its model on fake tensors, a fraction of
the step's simulation (for a 7B model, a second against several).
"""

from __future__ import annotations

import time
from typing import Any, Dict, List, Mapping

import torch

from hpc_train.compute.fit.breakdown import JobEstimate, RankEstimate
from hpc_train.compute.fit.estimate import EstimateSettings, kernels_as_on, with_state
from hpc_train.compute.fit.fake_world import fake_mode
from hpc_train.compute.training.optim import make_optimizer, param_groups
from hpc_train.compute.user.building import build_model
from hpc_train.contracts.strategy_table import KINDS


def floor_of(settings: EstimateSettings) -> JobEstimate:
    """The job's floor as an estimate of one rank (``floor`` set): the shares of its parameters, gradients and
    optimizer state, their sum its peak."""
    started = time.perf_counter()
    split = KINDS[settings.strategy.identity].ranks_share_model
    shares = max(1, int(settings.layout.world_size)) if split else 1
    parts = {name: count // shares for name, count in _whole(settings).items()}
    rank = RankEstimate(0, None, {}, **parts, peak=sum(parts.values()))
    words = f"{settings.layout.describe(on_cpus=True)}; floor: the model's share of {shares} rank(s), not simulated"
    return JobEstimate(words, [rank], time.perf_counter() - started, floor=True)


def _whole(settings: EstimateSettings) -> Dict[str, int]:
    """What the whole model holds at its optimizer's step, by part; made once per process for each model,
    optimisation and device (a refusal's settings share them)."""
    key = repr((settings.model, settings.optim, settings.device))
    if key not in _known:
        with fake_mode():
            model = build_model(settings.model)
            made = make_optimizer(settings.optim, param_groups(settings.optim, model))
            optimizer = with_state(kernels_as_on(settings.device, made))
            _known[key] = {
                "parameters": sum(t.nbytes for t in [*model.parameters(), *model.buffers()]),
                "gradients": sum(p.nbytes for p in model.parameters() if p.requires_grad),
                "optimizer_state": sum(v.nbytes for state in optimizer.state.values() for v in _tensors(state)),
            }
    return _known[key]


_known: Dict[str, Dict[str, int]] = {}  # _whole's answers, by its key


def _tensors(state: Mapping[str, Any]) -> List[torch.Tensor]:
    return [value for value in state.values() if isinstance(value, torch.Tensor)]
