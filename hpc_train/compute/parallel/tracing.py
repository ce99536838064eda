"""Cutting any model at named modules (``strategy.split_points``): its forward traced with ``torch.fx`` and
split into stage modules that pass on exactly the values crossing each boundary."""

from __future__ import annotations

import difflib
import inspect
from typing import Any, Dict, List, Sequence, Tuple

import torch
import torch.fx as fx
import torch.nn as nn
from torch.fx.graph import _PyTreeCodeGen  # torch private: how fx rebuilds a structured output (tested per torch)
from torch.utils import _pytree as pytree

from hpc_train.compute.runtime.refusal import Refusal


# -- splitting any model at named modules -----------------------------------------------------
def split_points_refusal(problem: str) -> Refusal:
    return Refusal(
        f"`strategy.split_points`: {problem} Fix: name modules of model.named_modules() in the order the forward pass"
        " uses them, e.g. strategy.split_points=[layer3] (one stage begins at each)."
    )


def _runs_inside(node: "torch.fx.Node", name: str) -> bool:
    """Whether `node` is a call of module `name` or any operation of its forward (as fx recorded the module stack).

    Not only its first submodule call: a block's own first operations (a traced LayerNorm's parameter
    fetch, a shape read) would otherwise fall in the previous stage and send Python ints between stages.
    """
    paths = [str(node.target)] if node.op == "call_module" else []
    paths += [path for path, _ in node.meta.get("nn_module_stack", {}).values()]
    return any(path == name or path.startswith(name + ".") for path in paths)


def _first_nodes(graph: "torch.fx.Graph", names: Sequence[str], known: Sequence[str]) -> List[int]:
    """Index (in graph order) of the first node that runs inside each named module."""
    nodes = list(graph.nodes)
    firsts = []
    for name in names:
        if name not in known or name == "":
            close = difflib.get_close_matches(name, [k for k in known if k], n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise split_points_refusal(f"the model has no module {name!r}{hint}.")
        index = next((i for i, n in enumerate(nodes) if _runs_inside(n, name)), None)
        if index is None:
            raise split_points_refusal(f"the traced forward pass never calls module {name!r}.")
        firsts.append(index)
    if firsts != sorted(firsts) or len(set(firsts)) != len(firsts):
        raise split_points_refusal(
            f"{list(names)} are not in the order the forward pass reaches them (or two begin at the same place)."
        )
    return firsts


def _refuse_inputs(model: nn.Module, required: Sequence[str]) -> Refusal:
    """More than one required forward input: stages are chained on exactly one tensor."""
    first, *extra = required
    example = ", ".join([first, *(f"{name}=None" for name in extra)])
    return Refusal(
        f"`strategy.split_points`: {type(model).__name__}.forward takes {len(required)} required inputs"
        f" ({', '.join(required)}), but a split model is called with one tensor, which its first stage receives."
        f" Fix: give the extra inputs default values (e.g. forward(self, {example})) so that the model is called"
        " with one tensor, wrap the model in a module whose forward takes one tensor, or train with strategy=ddp"
        " (no split)."
    )


def forward_inputs(model: nn.Module) -> Tuple[str, Dict[str, Any]]:
    """The forward's one tensor input, and every other argument bound to its default.

    Stages are called with one tensor, so the optional arguments (timm's ``attn_mask=None``, a language
    model's ``targets=None``) take their defaults and are traced as constants; *args and **kwargs are
    optional too. Only a forward with more than one required argument is refused.
    """
    variadic = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
    named = [p for p in inspect.signature(model.forward).parameters.values() if p.kind not in variadic]
    required = [p.name for p in named if p.default is inspect.Parameter.empty]
    if len(required) > 1:
        raise _refuse_inputs(model, required)
    if not named:
        raise split_points_refusal(
            f"{type(model).__name__}.forward names no input, but a split model is called with one."
        )
    inp = required[0] if required else named[0].name
    return inp, {p.name: p.default for p in named if p.name != inp}


def _drop_bound_inputs(graph: "torch.fx.Graph", inp: str) -> None:
    """Remove the placeholders fx adds for arguments bound to constants, with their guards.

    fx keeps a placeholder per bound argument, checked by ``_assert_is_none``/``_assert`` nodes, and one
    for an unused *args/**kwargs; a stage would otherwise expect them as inputs.
    """
    for node in [n for n in graph.nodes if n.op == "placeholder" and n.target != inp]:
        bound = not str(node.target).startswith("*")
        if not bound and node.users:
            raise split_points_refusal(
                f"{node.target} is used by the forward pass; a split model is called with one tensor."
            )
        guards, todo = set(), list(node.users)
        while todo:  # a bound placeholder's only users are its guards (fx passes the constant itself on)
            user = todo.pop()
            if user not in guards:
                guards.add(user)
                todo.extend(user.users)
        for user in reversed([n for n in graph.nodes if n in guards]):
            graph.erase_node(user)
        graph.erase_node(node)


def _trace(model: nn.Module) -> "torch.fx.Graph":
    """The model's forward as an fx graph with one placeholder: its tensor input."""
    inp, bound = forward_inputs(model)
    try:  # fx.Tracer, not fx.symbolic_trace: fx cannot compile a forward with tuple defaults and *args
        graph = fx.Tracer().trace(model, concrete_args=bound)
    except Exception as err:  # data-dependent control flow, unsupported Python
        raise Refusal(
            f"`strategy.split_points`: {type(model).__name__}'s forward cannot be traced with torch.fx"
            f" ({type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}), so hpc-train cannot cut it into"
            " stages (Hugging Face transformers' forwards are among those). Fix: train it with strategy=ddp (or"
            " single, dp), or write the model as an nn.Sequential of its stages."
        ) from None
    _drop_bound_inputs(graph, inp)
    return graph


def _stage_output(graph: "torch.fx.Graph", output_node: "torch.fx.Node", env: Dict[Any, Any]) -> Any:
    """The last stage's output, structured as the model's (fx flattens it when a default was a tuple or dict)."""
    value = fx.map_arg(output_node.args[0], lambda n: env[n])
    if isinstance(graph._codegen, _PyTreeCodeGen) and graph._codegen.pytree_info.out_spec is not None:
        return pytree.tree_unflatten(list(value), graph._codegen.pytree_info.out_spec)
    return value


def trace_split(model: nn.Module, split_points: List[str]) -> List[nn.Module]:
    """Cut `model` where each named module begins: ``len(split_points) + 1`` chained stages.

    The forward pass is traced symbolically with ``torch.fx`` (no example needed, any batch
    size), its optional arguments bound to their defaults (:func:`forward_inputs`). Each node
    goes to the stage of the last split point at or before it; a value made in one stage and
    used in a later one is passed through the stages between, so stage k takes exactly what
    stage k-1 returns. Parameters are shared with `model`, not copied.
    """
    graph = _trace(model)
    nodes = list(graph.nodes)
    firsts = _first_nodes(graph, split_points, [n for n, _ in model.named_modules()])
    placeholders = [n for n in nodes if n.op == "placeholder"]
    if len(placeholders) != 1:
        raise split_points_refusal(
            f"{type(model).__name__}.forward takes {len(placeholders)} inputs; a split model takes exactly one."
        )
    n_stages = len(split_points) + 1
    stage_of: Dict[fx.Node, int] = {}
    for i, node in enumerate(nodes):
        if node.op in ("placeholder", "get_attr"):
            continue  # inputs enter stage 0; attributes are fetched by whichever stage uses them
        stage_of[node] = n_stages if node.op == "output" else sum(1 for f in firsts if f <= i)
    for k in range(n_stages):
        if k not in stage_of.values():
            raise split_points_refusal(f"stage {k} of {n_stages} would hold no computation.")
    for node in placeholders:
        stage_of[node] = 0

    def last_use(node: fx.Node) -> int:
        return max((stage_of[u] for u in node.users if u in stage_of), default=-1)

    values = [n for n in nodes if n.op not in ("get_attr", "output")]
    crossing = [[v for v in values if stage_of[v] < k <= last_use(v)] for k in range(n_stages + 1)]
    stages = []
    output_node = next(n for n in nodes if n.op == "output")
    for k in range(n_stages):
        stage_graph = fx.Graph()
        env: Dict[fx.Node, fx.Node] = {}
        inputs = placeholders if k == 0 else crossing[k]
        for value in inputs:
            env[value] = stage_graph.placeholder(value.name)
        for node in nodes:
            if stage_of.get(node) != k or node.op == "placeholder":
                continue
            for arg in node.all_input_nodes:
                if arg.op == "get_attr" and arg not in env:
                    env[arg] = stage_graph.node_copy(arg)
            env[node] = stage_graph.node_copy(node, env.__getitem__)  # this stage's env, read at once
        if k == n_stages - 1:
            for arg in output_node.all_input_nodes:
                if arg.op == "get_attr" and arg not in env:
                    env[arg] = stage_graph.node_copy(arg)
            stage_graph.output(_stage_output(graph, output_node, env))
        else:
            live = [env[v] for v in crossing[k + 1]]
            stage_graph.output(live[0] if len(live) == 1 else tuple(live))
        stage_graph.lint()
        stages.append(fx.GraphModule(model, stage_graph, class_name=f"Stage{k}"))
    return stages


def stage_inputs(stages: Sequence[nn.Module], k: int, example: torch.Tensor) -> Tuple[torch.Tensor, ...]:
    """What stage k receives for `example`: the earlier stages run on it (no grad)."""
    carry: Any = example
    with torch.no_grad():
        for stage in stages[:k]:
            carry = stage(*carry) if isinstance(carry, tuple) else stage(carry)
    values = carry if isinstance(carry, tuple) else (carry,)
    if not all(isinstance(v, torch.Tensor) for v in values):
        raise split_points_refusal(
            f"stage {k} would receive a value that is not a tensor ({[type(v).__name__ for v in values]}), which cannot"
            " be sent between ranks."
        )
    return values
