"""The user's tensor-parallel plan (``strategy.tp_plan``) checked against their model and applied on the tp mesh.

A plan maps module-name patterns (``fnmatch`` over ``model.named_modules()`` names, e.g.
``layers.*.attention.wq``) to a style, or to ``{_target_: fn}`` called as ``fn(module, tp_mesh)`` on
each module it matches; a plan that is itself ``{_target_: fn}`` is called once as ``fn(model, tp_mesh)``.
The styles are torch's (``torch.distributed.tensor.parallel``):

* ``colwise``: the weight's output features split over the tp ranks; each rank's output is its
  slice of the last dimension (a local tensor), as the next ``rowwise`` layer expects;
* ``rowwise``: the input features split (an ``nn.Embedding``: its rows, the vocabulary), the
  partial outputs summed over the tp ranks, so every rank gets the whole output;
* ``colwise_gather``: ``colwise`` whose output is gathered whole on every rank (a model's last
  layer, before a loss that needs every logit).

What the model alone shows is refused at the rank's start, naming the module and the fix: a
pattern that matches nothing, a style on a module that is not an ``nn.Linear`` / ``nn.Embedding``,
a width or a head count the tp degree does not divide, and attention whose q, k and v share one
``nn.Linear`` (cut column-wise, rank 0 would get all of q and half of k).
"""

from __future__ import annotations

import fnmatch
from typing import Any, Callable, Dict, List, Mapping

import torch.nn as nn
from omegaconf import OmegaConf

from hpc_train.compute.runtime.refusal import Refusal
from hpc_train.compute.user.instantiate import instantiate_node
from hpc_train.config.strategy import TP_STYLES

KEY = "strategy.tp_plan"
HEAD_COUNTS = ("n_heads", "num_heads", "n_head", "num_attention_heads", "n_kv_heads", "num_key_value_heads")
FUSED_QKV = ("c_attn", "qkv", "qkv_proj", "wqkv", "query_key_value", "in_proj")  # names of q, k, v in one Linear


def is_whole_plan_function(plan: Mapping[str, Any]) -> bool:
    return "_target_" in plan


def _function(node: Mapping[str, Any], key: str) -> Callable:
    """The user's plan function named by `node`'s _target_ (its other keys bound as keyword arguments)."""
    config = OmegaConf.create({**{str(k): v for k, v in dict(node).items()}, "_partial_": True})
    return instantiate_node(config, key, "tensor-parallel plan function (module, tp_mesh) -> None")


def matches(model: nn.Module, plan: Mapping[str, Any]) -> Dict[str, List[str]]:
    """pattern -> the module names it matches (in named_modules() order)."""
    names = [name for name, _ in model.named_modules() if name]
    return {str(pattern): [n for n in names if fnmatch.fnmatchcase(n, str(pattern))] for pattern in plan}


def check_plan(model: nn.Module, plan: Mapping[str, Any], tp: int) -> None:
    """Refuse what this model cannot take from the plan at this tp degree (the whole model, before any cut)."""
    if is_whole_plan_function(plan):
        return
    examples = [name for name, _ in model.named_modules() if name][:4]
    for pattern, names in matches(model, plan).items():
        if not names:
            raise Refusal(
                f"`{KEY}`: the pattern {pattern!r} matches no module of {type(model).__name__} (its modules are named"
                f" like {', '.join(repr(n) for n in examples)}). Fix: write the pattern as model.named_modules()"
                " names it (fnmatch: * matches any run of characters, dots included), or drop it from the plan."
            )
        style = plan[pattern]
        if not isinstance(style, str):
            continue
        modules = dict(model.named_modules())
        for name in names:
            _check_module(name, modules[name], str(style), tp)
    _check_heads(model, plan, tp)


def _check_module(name: str, module: nn.Module, style: str, tp: int) -> None:
    if not isinstance(module, (nn.Linear, nn.Embedding)):
        raise Refusal(
            f"`{KEY}`: {name!r} is a {type(module).__name__}; {style} cuts an nn.Linear or an nn.Embedding. Fix: match"
            " only Linear/Embedding modules with the pattern, or give {_target_: my_package.my_plan} for this module."
        )
    last = name.rsplit(".", 1)[-1].lower()
    if style.startswith("colwise") and isinstance(module, nn.Linear) and last in FUSED_QKV:
        raise Refusal(
            f"`{KEY}`: {name!r} holds q, k and v in one nn.Linear ({module.in_features} -> {module.out_features});"
            " cut column-wise, each rank would get a slice across q, k and v instead of its own heads of each."
            " Fix: split it into three Linear layers (wq, wk, wv: see the Llama example), or leave it out of the plan"
            " (it then stays whole on every tp rank)."
        )
    if isinstance(module, nn.Linear):
        width, what = (module.out_features, "output") if style.startswith("colwise") else (module.in_features, "input")
    else:
        width, what = (
            (module.embedding_dim, "embedding") if style.startswith("colwise") else (module.num_embeddings, "row")
        )
    if width % tp:
        raise Refusal(
            f"`strategy.tp`: {name!r} has {width} {what} features, which tp={tp} does not divide ({style} gives each"
            f" rank 1/{tp} of them). Fix: choose strategy.tp dividing {width}, or leave {name!r} out of {KEY}."
        )


def _check_heads(model: nn.Module, plan: Mapping[str, Any], tp: int) -> None:
    """A module that counts its attention heads and has a colwise-cut child: tp must divide the heads."""
    cut = {n for pattern, names in matches(model, plan).items() if str(plan[pattern]) == "colwise" for n in names}
    for name, module in model.named_modules():
        for attr in HEAD_COUNTS:
            heads = getattr(module, attr, None)
            if not isinstance(heads, int) or heads % tp == 0:
                continue
            if any(c.startswith(f"{name}.") if name else True for c in cut):
                raise Refusal(
                    f"`strategy.tp`: {name or type(model).__name__!r} has {attr}={heads}, which tp={tp} does not"
                    f" divide: each rank would hold {heads / tp:g} heads. Fix: choose strategy.tp dividing {heads}."
                )


def apply_plan(model: nn.Module, plan: Mapping[str, Any], tp_mesh: Any) -> List[str]:
    """Cut `model`'s matched modules over `tp_mesh` in place; the names cut (a stage's subset under pp)."""
    from torch.distributed.tensor.parallel import parallelize_module  # only tensor-parallel runs pay it

    if is_whole_plan_function(plan):
        _function(plan, KEY)(model, tp_mesh)
        return ["(the plan function)"]
    modules = dict(model.named_modules())
    styles: Dict[str, Any] = {}
    for pattern, names in matches(model, plan).items():
        style = plan[pattern]
        for name in names:
            if isinstance(style, str):
                styles[name] = torch_style(str(style), modules[name])
            else:
                _function(style, f"{KEY}.{pattern}")(modules[name], tp_mesh)
    if styles:
        parallelize_module(model, tp_mesh, styles)
    return sorted(styles)


def torch_style(style: str, module: nn.Module) -> Any:
    """torch's ParallelStyle for one of :data:`TP_STYLES` on `module`."""
    # only tensor-parallel runs pay for torch's tensor-parallel styles
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    assert style in TP_STYLES, style
    if style == "colwise":
        return ColwiseParallel()
    if style == "colwise_gather":
        return ColwiseParallel(output_layouts=Replicate())
    if isinstance(module, nn.Embedding):  # token ids come whole to every rank
        return RowwiseParallel(input_layouts=Replicate())
    return RowwiseParallel()
