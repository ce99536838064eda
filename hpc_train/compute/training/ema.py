"""``trainer.ema_decay``: an exponential moving average of the weights, evaluated beside the raw ones.

timm's ``ModelEmaV3`` semantics without its warm-up: the average starts as a copy of the
initial parameters and after every optimizer step becomes ``decay * ema + (1 - decay) * param``
(``lerp`` with weight ``1 - decay``); buffers (batch-norm statistics) are not averaged, the
model's own are used when the average is evaluated, as ``ModelEmaV3`` copies them.

Why not ``torch.optim.swa_utils.AveragedModel``: it keeps a deep copy of the whole wrapped
module (a second FSDP module, a second DDP reducer) and its first update copies instead of
averaging; here the average is one tensor per parameter, laid out exactly like the parameter
(FSDP2's DTensor shards stay shards, so the average is checkpointed and resharded by
torch.distributed.checkpoint with the model), updated in place on the local shards.
"""

from __future__ import annotations

import contextlib
from typing import Dict, Iterator, List

import torch
import torch.nn as nn


def _local(tensor: torch.Tensor) -> torch.Tensor:
    """The local shard of a DTensor (a view: in-place updates write through), the tensor itself otherwise."""
    return tensor.to_local() if hasattr(tensor, "to_local") else tensor


class WeightAverage:
    """The moving average of `model`'s trainable parameters; ``state_dict`` keys are the parameter names.

    A DCP ``Stateful`` by its methods, like the trainer's TrainState (hpc_train.compute.training.state: see there
    for why it does not subclass it)."""

    def __init__(self, model: nn.Module, decay: float) -> None:
        self.decay = float(decay)
        named = [(name, p) for name, p in model.named_parameters() if p.requires_grad]
        self.names: List[str] = [name for name, _ in named]
        self.params: List[nn.Parameter] = [p for _, p in named]
        with torch.no_grad():
            self.average: List[torch.Tensor] = [p.detach().clone() for p in self.params]

    @torch.no_grad()
    def update(self) -> None:
        """One step of the average, after an optimizer step (on every rank: each updates its own shards)."""
        torch._foreach_lerp_(
            [_local(a) for a in self.average], [_local(p.detach()) for p in self.params], 1.0 - self.decay
        )

    @contextlib.contextmanager
    def swapped_in(self) -> Iterator[None]:
        """The model holds the averaged weights inside the block, its own again after it (evaluation)."""
        with torch.no_grad():
            own = [_local(p.detach()).clone() for p in self.params]
            for param, average in zip(self.params, self.average):
                _local(param.detach()).copy_(_local(average))
        try:
            yield
        finally:
            with torch.no_grad():
                for param, saved in zip(self.params, own):
                    _local(param.detach()).copy_(saved)

    def state_dict(self) -> Dict[str, torch.Tensor]:
        return dict(zip(self.names, self.average))

    def load_state_dict(self, state: Dict[str, torch.Tensor]) -> None:
        missing = sorted(set(self.names) - set(state))
        if missing:
            raise KeyError(f"the checkpoint's weight average has no {', '.join(missing[:3])}")
        with torch.no_grad():
            for name, average in zip(self.names, self.average):
                if state[name] is not average:  # DCP loads in place
                    _local(average).copy_(_local(state[name]).to(average.device))
