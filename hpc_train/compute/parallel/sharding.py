"""FSDP2 over a data-parallel mesh: which modules are sharded one by one, in what precision, compiled or not.

Shared by ``mesh`` and its ``fsdp`` preset. The units are the blocks of the model's repeated block list (a
transformer's layers; hpc_train.compute.parallel.partitioning.find_block_list), else the modules the user
names, else every direct child holding parameters (a ModuleList's members, not the list); the root takes what is
left. Each unit's parameters are all-gathered just before it runs and its gradients reduce-scattered after its
backward pass.
"""

from __future__ import annotations

import difflib
import logging
from typing import Any, Dict, List, Optional

import torch
import torch.nn as nn

from hpc_train.compute.parallel.partitioning import find_block_list
from hpc_train.compute.parallel.precision import DTYPES
from hpc_train.compute.runtime.refusal import Refusal

log = logging.getLogger("hpc_train")


def shard_units(model: nn.Module, names: Optional[List[str]] = None) -> List[nn.Module]:
    """The modules sharded one by one (each all-gathered on its own): named ones, else the blocks of the
    model's repeated block list (however few of its parameters they hold: beside a large vocabulary, the embedding
    stays with the root, whose forward reads it), else every direct child that holds parameters."""
    if names:
        known = dict(model.named_modules())
        for name in names:
            if name not in known or not name:
                close = difflib.get_close_matches(name, [k for k in known if k], n=1)
                raise Refusal(
                    f"`strategy.wrap`: the model has no module {name!r}"
                    f"{f' (did you mean {close[0]!r}?)' if close else ''}."
                    " Fix: name modules of model.named_modules(), e.g. strategy.wrap=[encoder,decoder], or"
                    " strategy.wrap=null (each block of the model's block list)."
                )
        return [known[name] for name in names]
    try:
        return list(find_block_list(model, most=False).blocks)
    except Refusal:
        return children_with_parameters(model)


def children_with_parameters(module: nn.Module) -> List[nn.Module]:
    """`module`'s direct children that hold parameters, a container's (nn.ModuleList, nn.ModuleDict: no forward of
    its own, which FSDP2 refuses and which never runs) replaced by its members: a block list holding too few of the
    model's parameters to be the units on its own (beside a large vocabulary) still gives one unit a block."""
    units: List[nn.Module] = []
    for child in module.children():
        if not any(True for _ in child.parameters()):
            continue
        containers = (nn.ModuleList, nn.ModuleDict)
        units.extend(children_with_parameters(child) if isinstance(child, containers) else [child])
    return units


def mixed_precision_policy(precision: str) -> Optional[Any]:
    """bf16/fp16 parameters for compute, gradients reduced in fp32 (FSDP2's MixedPrecisionPolicy)."""
    if precision not in DTYPES:
        return None
    from torch.distributed.fsdp import MixedPrecisionPolicy  # ~0.6 s to import: only sharded runs pay it

    return MixedPrecisionPolicy(param_dtype=DTYPES[precision], reduce_dtype=torch.float32)


def compile_units(units: List[nn.Module]) -> bool:
    """torch.compile each unit's forward in place before it is sharded (its parameter names stay the same), as
    torchtitan does; False when this torch cannot (the run goes on uncompiled, with a warning). The forward, not the
    module's call: FSDP2's hooks, which dynamo must skip, stay outside the compiled code (a compiled call traced them
    and, skipping them, compiled no graph at all)."""
    try:
        for unit in units:
            unit.forward = torch.compile(unit.forward)
    except Exception as err:  # a torch that cannot compile here (a backend that is missing)
        log.warning("trainer.compile is ignored: compiling the model's blocks failed on this torch (%s)", err)
        return False
    return True


def shard(model: nn.Module, units: List[nn.Module], options: Dict[str, Any]) -> None:
    """fully_shard each unit, then the root, with `options` (mesh, reshard_after_forward, mp_policy, ...)."""
    from torch.distributed.fsdp import fully_shard  # ~0.6 s to import: only sharded runs pay it

    for unit in units:
        fully_shard(unit, **options)
    fully_shard(model, **options)
