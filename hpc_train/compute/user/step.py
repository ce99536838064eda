"""The training step: what turns one batch into a loss (and, optionally, metrics).

``trainer.step: null`` is the built-in supervised step, ``loss_fn(model(input), target)`` on
``(input, target)`` pairs (``trainer.loss`` is the loss). Any other value is the user's own
function ``step(model, batch)``, instantiated from a ``_target_`` node with ``_partial_: true``
(as Lightning's ``training_step``): it returns a scalar loss tensor, or a mapping with ``loss``
and other scalar metrics. Every strategy that runs the whole model in one process (single, dp,
ddp) calls it the same way, inside autocast, for training and (under ``torch.no_grad()`` and
``model.eval()``) for evaluation. The split strategies compute the loss outside the model and
run only the built-in step (the launch side refuses a user step with them).
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch
import torch.nn as nn

from hpc_train.compute.data.batch import describe
from hpc_train.compute.runtime.refusal import Refusal
from hpc_train.compute.user.instantiate import instantiate_node

# Keys of the metrics.jsonl records and of summary.json a metric of the user's step may not take.
RESERVED_METRICS = (
    "kind",
    "step",
    "epoch",
    "lr",
    "time",
    "accuracy",
    "samples",
    "grad_norm",
    "samples_per_sec",
    "tokens_per_sec",
)
RESERVED_PREFIXES = ("lr_group",)  # each parameter group's LR after the first


class SupervisedStep:
    """trainer.step=null: the loss of the model's output against the target of an (input, target) pair."""

    builtin = True

    def __init__(self, loss_fn: Callable) -> None:
        self.loss_fn = loss_fn

    def __call__(self, model: nn.Module, batch: Any) -> torch.Tensor:
        inputs, targets = batch
        outputs = model(inputs)
        return self.loss_fn(outputs, targets.to(outputs.device, non_blocking=True))


def build_step(node: Optional[Mapping[str, Any]], loss_fn: Callable) -> Callable:
    """The step the ``trainer.step`` node names (a partial function of the user's package); None: the built-in one."""
    if node is None:
        return SupervisedStep(loss_fn)
    try:
        step = instantiate_node(node, "trainer.step", "training step (a function step(model, batch))")
    except Refusal as refusal:
        if node.get("_partial_"):
            raise
        raise Refusal(f"{refusal} A function step(model, batch) also needs trainer.step._partial_=true.") from None
    if not node.get("_partial_") and not _takes_two(step):
        raise Refusal(
            f"`trainer.step`: {node._target_} was called to build the step (trainer.step has no _partial_: true) and"
            f" returned {describe(step)}. Fix: set trainer.step._partial_=true, so the function itself is the step."
        )
    if not callable(step):
        raise Refusal(
            f"`trainer.step`: {node._target_} built a {type(step).__name__}, which cannot be called. Fix: name a"
            " function step(model, batch) and set trainer.step._partial_=true."
        )
    return step


def _takes_two(fn: Any) -> bool:
    """Whether `fn` can be called as fn(model, batch)."""
    if not callable(fn):
        return False
    try:
        inspect.signature(fn).bind(None, None)
    except TypeError:
        return False
    except ValueError:  # no signature (a builtin): let the start-of-job call tell
        return True
    return True


def is_builtin(step: Callable) -> bool:
    return bool(getattr(step, "builtin", False))


def _scalar(value: Any, what: str) -> torch.Tensor:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return torch.tensor(float(value))
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        return value.reshape(())
    raise Refusal(
        f"`trainer.step`: {what} is {describe(value)}, not one number. Fix: return a scalar (e.g. the batch's mean"
        " loss, loss.mean()) for it."
    )


def split_result(result: Any, reduce: Callable[[Any], Any] = lambda v: v) -> Tuple[torch.Tensor, Dict[str, Any]]:
    """(loss, other metrics) of what a step returned; a Refusal naming trainer.step for anything else.

    `reduce` combines per-replica values first (nn.DataParallel gathers one loss per GPU).
    """
    if isinstance(result, Mapping):
        if "loss" not in result:
            raise Refusal(
                f"`trainer.step`: it returned a mapping without a 'loss' key (keys: {', '.join(map(str, result))})."
                " Fix: return the loss tensor, or a dict {'loss': loss, ...other scalar metrics}."
            )
        loss = _scalar(reduce(result["loss"]), "its 'loss'")
        metrics = {str(k): _scalar(reduce(v), f"its metric {k!r}") for k, v in result.items() if k != "loss"}
    elif isinstance(result, torch.Tensor):
        loss, metrics = _scalar(reduce(result), "the loss it returned"), {}
    else:
        raise Refusal(
            f"`trainer.step`: it returned {describe(result)}; a step returns the loss (a scalar tensor) or a dict with"
            " 'loss'. Fix: return loss (e.g. `_, loss = model(x, y); return loss`)."
        )
    if not loss.requires_grad and torch.is_grad_enabled():
        raise Refusal(
            "`trainer.step`: the loss it returned does not require grad, so no parameter can learn from it (was it"
            " computed under torch.no_grad(), or detached / turned into a float?). Fix: return the loss tensor the"
            " model's forward computed."
        )
    return loss, metrics


def check_step(step: Callable, model: nn.Module, batch: Any) -> List[str]:
    """Call the user's step once on a tiny CPU batch (no grad, eval mode); the names of its metrics.

    A step that raises, returns a non-scalar or returns no loss is refused here, naming trainer.step,
    before any training step of any rank.
    """
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            try:
                result = step(model, batch)
            except Refusal:
                raise
            except Exception as err:
                raise Refusal(
                    f"`trainer.step`: calling it on a batch of the training set ({describe(batch)}) raised"
                    f" {type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}. Fix: make the step take"
                    " (model, batch) as the data loader yields it, or change the dataset."
                ) from None
            _, metrics = split_result(result)
    finally:
        model.train(was_training)
    clash = sorted(name for name in metrics if name in RESERVED_METRICS or name.startswith(RESERVED_PREFIXES))
    if clash:
        raise Refusal(
            f"`trainer.step`: its metric name(s) {', '.join(clash)} are taken by hpc-train's own records. Fix: rename"
            " them (e.g. 'top1' instead of 'accuracy')."
        )
    return list(metrics)
