"""A group's training state as plain local tensors, to hand to a restarting group and to take from a live one.

Every group has the same layout inside (the same strategy over the same number of ranks), so rank r of one group
holds exactly the shards rank r of another holds: a DTensor travels as its local shard and is put back into the
receiver's own DTensor in place. What travels is a snapshot (clones): the sender trains on while the receiver
fetches it.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, Mapping

import torch
import torch.nn as nn

from hpc_train.errors import JobFailed


def local_tree(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        local = value.to_local() if hasattr(value, "to_local") and hasattr(value, "placements") else value
        return local.detach().clone()
    if isinstance(value, dict):
        return {key: local_tree(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(local_tree(item) for item in value)
    return value


def _is_dtensor(value: Any) -> bool:
    return isinstance(value, torch.Tensor) and hasattr(value, "placements") and hasattr(value, "to_local")


@torch.no_grad()
def model_state(model: nn.Module) -> Dict[str, torch.Tensor]:
    return {name: local_tree(value) for name, value in model.state_dict().items()}


@torch.no_grad()
def load_model_state(model: nn.Module, incoming: Mapping[str, torch.Tensor]) -> None:
    """Copy `incoming` (local shards) into the model's own parameters and buffers, in place."""
    own = model.state_dict()
    missing = sorted(set(own) - set(incoming))
    if missing:
        raise JobFailed(f"the live group's state lacks {missing[:3]}: the groups do not hold the same model")
    for name, value in own.items():
        target = value.to_local() if _is_dtensor(value) else value
        target.copy_(incoming[name].to(target.device))


def optimizer_state(optimizer: torch.optim.Optimizer) -> Dict[str, Any]:
    return local_tree(optimizer.state_dict())


def load_optimizer_state(optimizer: torch.optim.Optimizer, incoming: Dict[str, Any]) -> None:
    """Load `incoming` (local shards) into the optimizer: a state tensor shaped like its parameter's local shard
    becomes a DTensor laid out as that parameter is."""
    params = [p for group in optimizer.param_groups for p in group["params"]]
    state = {}
    for index, values in incoming["state"].items():
        param = params[int(index)]
        state[index] = {name: _placed(value, param) for name, value in values.items()}
    optimizer.load_state_dict({"state": state, "param_groups": incoming["param_groups"]})


def _placed(value: Any, param: torch.Tensor) -> Any:
    if not isinstance(value, torch.Tensor):
        return value
    if _is_dtensor(param):
        local = param.to_local()
        if value.dim() > 0 and value.shape == local.shape:
            from torch.distributed.tensor import DTensor  # only sharded (FSDP2) state: the others never pay it

            return DTensor.from_local(
                value.to(local.device),
                param.device_mesh,
                param.placements,
                run_check=False,
                shape=param.shape,
                stride=param.stride(),
            )
    return value.to(param.device) if value.dim() > 0 else value


class Holder:
    """A state holder (state_dict / load_state_dict) made of two functions."""

    def __init__(self, save: Callable[[], Any], load: Callable[[Any], None]) -> None:
        self.state_dict, self.load_state_dict = save, load
