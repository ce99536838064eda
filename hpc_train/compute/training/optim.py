"""The optimizer, its parameter groups, the LR schedule and the run length, from `trainer.*`.

* ``trainer.optimizer``: ``sgd`` or ``adamw`` (torch's, with ``trainer.lr``, ``trainer.momentum``
  for SGD and ``trainer.weight_decay``), or a ``_target_`` node with ``_partial_: true`` called
  as ``f(param_groups, lr=trainer.lr, weight_decay=trainer.weight_decay)`` (a key the node sets
  itself wins): any ``torch.optim`` class, or the user's own (Muon, Lion, ...).
* ``trainer.param_groups``: ``single`` (one group, every parameter decayed), ``no_decay_1d``
  (nanoGPT's and timm's rule: weight decay only on parameters of 2 or more dimensions; biases,
  norm weights and other 1-D parameters get ``weight_decay: 0``), or a ``_target_`` function
  ``groups(model) -> list[dict]``. Groups are made from the parameters the strategy left in
  this process: FSDP2's sharded DTensors (whose ``dim()`` is the full tensor's), one stage's
  parameters with the pipelining engine.
* ``trainer.lr_schedule``: ``constant``, ``cosine`` (to ``trainer.min_lr``), ``step``, each after
  ``trainer.lr_warmup_steps`` of linear warm-up, spanning ``trainer.lr_schedule_steps`` (null: the run's length;
  set, a run stopped early and resumed to a larger ``trainer.max_steps`` keeps its schedule); or a ``_target_`` node
  with ``_partial_: true`` building a ``torch.optim.lr_scheduler`` from the optimizer, stepped once per optimizer step
  (it sets its own warm-up and length: ``trainer.lr_warmup_steps`` must stay 0).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence, Union

import torch
import torch.nn as nn
from omegaconf import DictConfig

from hpc_train.compute.runtime.refusal import Refusal
from hpc_train.compute.user.instantiate import instantiate_node


@dataclass(frozen=True)
class OptimSettings:
    """The trainer keys of optimisation: the optimizer, its parameter groups and LR schedule, and how a step updates
    the weights (gradient clipping, accumulation, a weight average)."""

    optimizer: Union[str, Any]  # sgd | adamw | a _target_ node
    param_groups: Union[str, Any]  # single | no_decay_1d | a _target_ node
    lr: float
    min_lr: float
    momentum: float
    weight_decay: float
    lr_schedule: Union[str, Any]  # constant | cosine | step | a _target_ node
    lr_schedule_steps: Optional[int]  # the built-in schedule's length; None: the run's
    lr_warmup_steps: int
    lr_step_every: int
    lr_step_gamma: float
    grad_clip: Optional[float]  # None: gradients are not clipped
    grad_accum_steps: int
    ema_decay: Optional[float]  # None: no weight average


def is_target(value: Any) -> bool:
    """A ``_target_`` node (the user's own class or function) rather than a built-in name."""
    return isinstance(value, (DictConfig, dict)) and "_target_" in value


# -- parameter groups -----------------------------------------------------------------------
def param_groups(settings: OptimSettings, model: nn.Module) -> List[Dict[str, Any]]:
    """The optimizer's parameter groups, as ``trainer.param_groups`` asks, over ``model``'s parameters."""
    choice = settings.param_groups
    if is_target(choice):
        return _user_groups(choice, model)
    params = list(model.parameters())
    if choice == "no_decay_1d":
        decay = [p for p in params if p.dim() >= 2]
        no_decay = [p for p in params if p.dim() < 2]
        return [g for g in ({"params": decay}, {"params": no_decay, "weight_decay": 0.0}) if g["params"]]
    return [{"params": params}]


def _user_groups(node: Any, model: nn.Module) -> List[Dict[str, Any]]:
    groups_fn = instantiate_node(node, "trainer.param_groups", "function groups(model) -> list of dicts")
    if not node.get("_partial_") and not callable(groups_fn):
        raise Refusal(
            f"`trainer.param_groups`: {node._target_} was called without the model. Fix: set"
            " trainer.param_groups._partial_=true, so it is called as groups(model)."
        )
    try:
        groups = groups_fn(model)
    except Exception as err:
        raise Refusal(
            f"`trainer.param_groups`: {node._target_}(model) raised {type(err).__name__}: {err}. Fix: make it take the"
            " model and return a list of dicts, each with 'params' (and any optimizer option per group)."
        ) from None
    if (
        not isinstance(groups, (list, tuple))
        or not groups
        or not all(isinstance(g, dict) and "params" in g for g in groups)
    ):
        raise Refusal(
            f"`trainer.param_groups`: {node._target_}(model) returned {type(groups).__name__}, not a non-empty list"
            " of dicts with 'params'. Fix: return e.g. [{'params': decay}, {'params': no_decay, 'weight_decay': 0.0}]."
        )
    return [dict(g, params=list(g["params"])) for g in groups]


# -- the optimizer --------------------------------------------------------------------------
def make_optimizer(settings: OptimSettings, groups: Sequence[Dict[str, Any]]) -> torch.optim.Optimizer:
    choice = settings.optimizer
    if is_target(choice):
        return _user_optimizer(choice, settings, groups)
    if choice == "sgd":
        return torch.optim.SGD(groups, lr=settings.lr, momentum=settings.momentum, weight_decay=settings.weight_decay)
    return torch.optim.AdamW(groups, lr=settings.lr, weight_decay=settings.weight_decay)


def _user_optimizer(node: Any, settings: OptimSettings, groups: Sequence[Dict[str, Any]]) -> torch.optim.Optimizer:
    build = instantiate_node(node, "trainer.optimizer", "optimizer (e.g. torch.optim.AdamW with _partial_: true)")
    given = {"lr": settings.lr, "weight_decay": settings.weight_decay}  # passed unless the node sets them itself
    defaults = {key: float(value) for key, value in given.items() if key not in node}
    try:
        optimizer = build(list(groups), **defaults)
    except Exception as err:
        raise Refusal(
            f"`trainer.optimizer`: {node._target_}(param_groups, {', '.join(f'{k}=...' for k in defaults)}) raised"
            f" {type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}. Fix: set"
            " trainer.optimizer._partial_=true and give only arguments the optimizer takes."
        ) from None
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise Refusal(
            f"`trainer.optimizer`: {node._target_} built a {type(optimizer).__name__}, not a torch.optim.Optimizer."
            " Fix: name an optimizer class (or a function returning one) with trainer.optimizer._partial_=true."
        )
    return optimizer


# -- the schedule ---------------------------------------------------------------------------
def lr_factor(settings: OptimSettings, total_steps: int, base_lr: float = 1.0) -> Callable[[int], float]:
    """Multiplier of a group's base LR at a given step: linear warm-up, then constant, cosine (to
    ``trainer.min_lr``) or step. Without a floor the cosine factor is the plain ``0.5 * (1 + cos)``."""
    warmup = int(settings.lr_warmup_steps)
    min_lr = float(settings.min_lr)

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        if settings.lr_schedule == "cosine":
            progress = (step - warmup) / max(1, total_steps - warmup)
            cosine = 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))
            return (min_lr + (base_lr - min_lr) * cosine) / base_lr if min_lr else cosine
        if settings.lr_schedule == "step":
            return float(settings.lr_step_gamma) ** ((step - warmup) // int(settings.lr_step_every))
        return 1.0

    return factor


def make_schedule(settings: OptimSettings, optimizer: torch.optim.Optimizer, total_steps: int) -> Any:
    """The LR scheduler; a built-in one spans ``trainer.lr_schedule_steps``, or the run's `total_steps` without."""
    choice = settings.lr_schedule
    if is_target(choice):
        return _user_schedule(choice, optimizer)
    declared = settings.lr_schedule_steps  # null (declared): the run's own length
    length = total_steps if declared is None else int(declared)
    factors = [lr_factor(settings, length, float(group["lr"])) for group in optimizer.param_groups]
    return torch.optim.lr_scheduler.LambdaLR(optimizer, factors)


def _user_schedule(node: Any, optimizer: torch.optim.Optimizer) -> Any:
    build = instantiate_node(node, "trainer.lr_schedule", "LR scheduler (e.g. torch.optim.lr_scheduler.OneCycleLR)")
    try:
        schedule = build(optimizer)
    except Exception as err:
        raise Refusal(
            f"`trainer.lr_schedule`: {node._target_}(optimizer) raised {type(err).__name__}:"
            f" {str(err).splitlines()[0] if str(err) else ''}. Fix: set trainer.lr_schedule._partial_=true and give"
            " every other argument (e.g. T_max, total_steps) as a key of trainer.lr_schedule."
        ) from None
    if not callable(getattr(schedule, "step", None)) or not callable(getattr(schedule, "state_dict", None)):
        raise Refusal(
            f"`trainer.lr_schedule`: {node._target_} built a {type(schedule).__name__}, not an LR scheduler (no"
            " step()/state_dict()). Fix: name a torch.optim.lr_scheduler class with trainer.lr_schedule._partial_=true."
        )
    return schedule


def group_lrs(optimizer: torch.optim.Optimizer) -> Dict[str, float]:
    """Each group's current LR: the first as ``lr``, the others as ``lr_group1``, ``lr_group2``, ..."""
    lrs = [float(group["lr"]) for group in optimizer.param_groups]
    return {"lr": lrs[0], **{f"lr_group{i}": lr for i, lr in enumerate(lrs[1:], start=1)}}


def total_steps(epochs: Optional[int], max_steps: Optional[int], steps_per_epoch: int) -> int:
    """trainer.epochs x steps per epoch, capped by trainer.max_steps (either may be null)."""
    bounds = []
    if epochs is not None:
        bounds.append(int(epochs) * steps_per_epoch)
    if max_steps is not None:
        bounds.append(int(max_steps))
    return min(bounds)
