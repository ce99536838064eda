"""Cut a model into consecutive stages on several devices, optionally pipelining micro-batches.

This generalises the two-GPU ResNet split of the seed material (``seq0`` on cuda:0, ``seq1``
on cuda:1) to any number of stages and to automatic boundaries:

* ``balance="params"``: contiguous stages with the largest stage's parameter count as small as
  possible (exact linear partition);
* ``balance="time"``: the same, weighting each layer by its measured forward + backward time
  on one micro-batch (what a pipeline stage spends per micro-batch), measured once on rank 0 and
  broadcast, so that every rank of a distributed run cuts the model at the same layers;
* ``balance=[n1, n2, ...]``: explicit layer counts per stage;
* ``split_points=[name, ...]``: any model, cut where the named modules (``named_modules()``)
  begin, by tracing its forward with ``torch.fx`` (see :func:`trace_split`).

Every stage takes the values that cross its front boundary as positional arguments and
returns those that cross its back boundary (one tensor for a plain chain), so stages chain
on any number of devices, in one process or one rank per stage.

With ``chunks > 1`` the batch is cut into micro-batches pushed through the stages in fill-drain
order: at clock tick t, stage s runs micro-batch t - s, so on GPUs (asynchronous kernels) stage
s+1 works on micro-batch j-1 while stage s works on j. Batch norm then sees per-micro-batch
statistics in training (``batchnorm=keep``, the default, like the seed); ``freeze`` puts every
batch-norm layer in eval mode (running statistics, exact equivalence to the unsplit model).
"""

from __future__ import annotations

import copy
import difflib
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

import torch
import torch.nn as nn
from torchvision.models.resnet import ResNet

from hpc_train.compute.refusal import Refusal


def flatten_layers(model: nn.Module) -> List[nn.Module]:
    """The model as a list of layers whose composition is the model's forward."""
    if isinstance(model, ResNet):
        blocks = [block for layer in (model.layer1, model.layer2, model.layer3, model.layer4) for block in layer]
        return [model.conv1, model.bn1, model.relu, model.maxpool, *blocks, model.avgpool, nn.Flatten(1), model.fc]
    if isinstance(model, nn.Sequential):
        return list(model)
    raise Refusal(
        f"`strategy.split_points`: {type(model).__name__} is neither an nn.Sequential nor a torchvision ResNet, so it"
        " cannot be cut automatically. Fix: name the modules where each new stage begins, e.g."
        " strategy.split_points=[head] (names as in model.named_modules())."
    )


def partition(weights: Sequence[float], stages: int) -> List[int]:
    """Layer counts per stage minimising the heaviest stage (contiguous, every stage non-empty)."""
    n = len(weights)
    if not 1 <= stages <= n:
        raise ValueError(f"cannot cut {n} layers into {stages} stages")
    prefix = [0.0]
    for w in weights:
        prefix.append(prefix[-1] + w)
    inf = float("inf")
    # best[k][i]: minimal max-stage weight for the first i layers in k stages
    best = [[inf] * (n + 1) for _ in range(stages + 1)]
    cut = [[0] * (n + 1) for _ in range(stages + 1)]
    best[0][0] = 0.0
    for k in range(1, stages + 1):
        for i in range(k, n - (stages - k) + 1):
            for j in range(k - 1, i):
                cost = max(best[k - 1][j], prefix[i] - prefix[j])
                if cost < best[k][i]:
                    best[k][i], cut[k][i] = cost, j
    counts, i = [], n
    for k in range(stages, 0, -1):
        j = cut[k][i]
        counts.append(i - j)
        i = j
    return counts[::-1]


def layer_times(layers: Sequence[nn.Module], example: torch.Tensor, repeats: int = 3) -> List[float]:
    """Forward + backward time of each layer on an example batch (median of a few runs, CPU or one device).

    Backward counts because a stage's step is its forward and its backward, and their ratio varies
    along a network (on CPU a late ResNet block's backward costs 2-3x its forward, an early one's
    about 1x): forward time alone leaves the last stage with most of the step. Each layer is timed
    on a copy, so the model's batch-norm statistics and gradients are untouched.
    """
    times, x = [], example
    for index, layer in enumerate(layers):
        probe, runs = copy.deepcopy(layer), []
        for _ in range(repeats):
            leaf = x.detach().requires_grad_(index > 0 and x.is_floating_point())
            start = time.perf_counter()
            y = probe(leaf.clone())  # a non-leaf copy: layers such as ResNet's ReLU work in place
            if isinstance(y, torch.Tensor) and y.requires_grad:
                y.backward(torch.ones_like(y))
            if isinstance(y, torch.Tensor) and y.is_cuda:
                torch.cuda.synchronize(y.device)
            runs.append(time.perf_counter() - start)
        times.append(sorted(runs)[len(runs) // 2] + 1e-9)
        x = y.detach()
    return times


def micro_batch_size(batch: int, chunks: int) -> int:
    """Images per micro-batch when `batch` images are cut into `chunks` (the last may hold fewer)."""
    return max(1, -(-batch // max(1, chunks)))


def micro_batch(example: torch.Tensor, chunks: int) -> torch.Tensor:
    """The first micro-batch of `example` cut into `chunks` (what one pipeline step of a stage sees)."""
    return example[: micro_batch_size(example.shape[0], chunks)]


def agree_on_counts(measure: Callable[[], List[int]]) -> List[int]:
    """Layer counts measured by rank 0 of the default process group, on every rank (measured here without one).

    Timings differ between processes, so ranks that measured their own layer times could cut the
    model at different layers: the pipeline's stages would not fit and DDP replicas would differ.
    """
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return list(measure())
    box: List[Any] = [list(measure()) if dist.get_rank() == 0 else None]
    dist.broadcast_object_list(box, src=0)
    return list(box[0])


def stage_counts(
    layers: Sequence[nn.Module], stages: int, balance: Union[str, Sequence[int]], example: torch.Tensor = None
) -> List[int]:
    if stages > len(layers):
        raise Refusal(
            f"`strategy.stages`: the model has {len(layers)} layers to cut, fewer than {stages} stages. Fix: use at"
            f" most strategy.stages={len(layers)}."
        )
    if not isinstance(balance, str):
        counts = [int(c) for c in balance]
        if len(counts) != stages or sum(counts) != len(layers) or min(counts) < 1:
            raise Refusal(
                f"`strategy.balance`: {counts} must list {stages} positive layer counts summing to {len(layers)}. Fix:"
                f" give {stages} numbers that add up to {len(layers)}, or use strategy.balance=params."
            )
        return counts
    if balance == "time":
        if example is None:
            raise ValueError("balance=time needs an example batch")
        return agree_on_counts(lambda: partition(layer_times(layers, example), stages))
    return partition([float(sum(p.numel() for p in layer.parameters())) for layer in layers], stages)


class StagedModel(nn.Module):
    """Consecutive stages on consecutive devices; ``chunks > 1`` pipelines micro-batches."""

    def __init__(
        self,
        stages: Sequence[nn.Sequential],
        devices: Sequence[torch.device],
        chunks: int = 1,
        freeze_batchnorm: bool = False,
    ) -> None:
        super().__init__()
        self.stages = nn.ModuleList(stage.to(device) for stage, device in zip(stages, devices))
        self.devices = list(devices)
        self.chunks = chunks
        self.freeze_batchnorm = freeze_batchnorm
        self.train(True)

    def train(self, mode: bool = True) -> "StagedModel":
        super().train(mode)
        if self.freeze_batchnorm:
            for module in self.modules():
                if isinstance(module, nn.modules.batchnorm._BatchNorm):
                    module.eval()
        return self

    @property
    def output_device(self) -> torch.device:
        return self.devices[-1]

    def _stage(self, s: int, carry: Any) -> Any:
        """Stage s on the values crossing its front boundary (a tensor, or a tuple for traced splits)."""
        device = self.devices[s]
        if isinstance(carry, tuple):
            return self.stages[s](
                *(v.to(device, non_blocking=True) if isinstance(v, torch.Tensor) else v for v in carry)
            )
        return self.stages[s](carry.to(device, non_blocking=True))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.chunks <= 1:
            for s in range(len(self.stages)):
                x = self._stage(s, x)
            return x
        micro = list(x.split(micro_batch_size(x.shape[0], self.chunks)))
        n_stages = len(self.stages)
        current: List[Any] = list(micro)
        # Fill-drain: tick t runs stage s on micro-batch t - s, last stage first, so that the
        # kernels of stage s+1 (micro-batch j-1) are queued before those of stage s (micro-batch j).
        for tick in range(len(micro) + n_stages - 1):
            for s in range(min(tick, n_stages - 1), -1, -1):
                j = tick - s
                if 0 <= j < len(micro):
                    current[j] = self._stage(s, current[j])
        return torch.cat(current)


def split_model(
    model: nn.Module, stages: int, balance, split_points: Optional[Sequence[str]] = None, example: torch.Tensor = None
) -> List[nn.Module]:
    """The model as consecutive stage modules: traced at `split_points`, else flattened and balanced."""
    if split_points:
        groups = trace_split(model, [str(name) for name in split_points])
    else:
        layers = flatten_layers(model)
        counts = stage_counts(layers, stages, balance, example)
        groups, start = [], 0
        for count in counts:
            groups.append(nn.Sequential(*layers[start : start + count]))
            start += count
    refuse_parameters_shared_across_stages(model, groups)
    return groups


def refuse_parameters_shared_across_stages(model: nn.Module, groups: Sequence[nn.Module]) -> None:
    """Tied weights (one parameter used by two layers, as a language model's embedding and output
    layer) must fall in one stage: stages live on different devices or ranks, where a shared
    parameter would either sit on the wrong device or be copied per rank and trained apart.
    """
    names: Dict[int, List[str]] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        names.setdefault(id(param), []).append(name)
    owner: Dict[int, int] = {}
    for k, group in enumerate(groups):
        for param in group.parameters():
            first = owner.setdefault(id(param), k)
            if first != k:
                tied = " and ".join(repr(n) for n in names.get(id(param), ["?"]))
                raise Refusal(
                    f"`strategy.balance`: {tied} are one parameter (tied weights), used by stage {first} and stage {k}."
                    " Each stage lives on its own device or rank, where one parameter cannot be shared (its copies"
                    " would train apart). Fix: cut the model so that every layer using it falls in one stage"
                    " (strategy.balance=[n1, n2, ...] or strategy.split_points=[...]), untie the weights, or train"
                    " with strategy=ddp or single."
                )


def build_staged(
    model: nn.Module,
    devices: Sequence[torch.device],
    stages: int,
    balance,
    chunks: int,
    freeze_batchnorm: bool,
    example: torch.Tensor = None,
    split_points: Optional[Sequence[str]] = None,
) -> StagedModel:
    if example is not None:
        example = micro_batch(example, chunks)  # balance=time: the size each stage computes on
    groups = split_model(model, stages, balance, split_points, example)
    return StagedModel(groups, [devices[i % len(devices)] for i in range(len(groups))], chunks, freeze_batchnorm)


# -- splitting any model at named modules -----------------------------------------------------
def _refuse_split(problem: str) -> Refusal:
    return Refusal(
        f"`strategy.split_points`: {problem} Fix: name modules of model.named_modules() in the order the forward pass"
        " uses them, e.g. strategy.split_points=[layer3] (one stage begins at each)."
    )


def _first_nodes(graph: "torch.fx.Graph", names: Sequence[str], known: Sequence[str]) -> List[int]:
    """Index (in graph order) of the first node that runs inside each named module."""
    nodes = list(graph.nodes)
    firsts = []
    for name in names:
        if name not in known or name == "":
            close = difflib.get_close_matches(name, [k for k in known if k], n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise _refuse_split(f"the model has no module {name!r}{hint}.")
        index = next(
            (
                i
                for i, n in enumerate(nodes)
                if n.op == "call_module" and (n.target == name or str(n.target).startswith(name + "."))
            ),
            None,
        )
        if index is None:
            raise _refuse_split(f"the traced forward pass never calls module {name!r}.")
        firsts.append(index)
    if firsts != sorted(firsts) or len(set(firsts)) != len(firsts):
        raise _refuse_split(
            f"{list(names)} are not in the order the forward pass reaches them (or two begin at the same place)."
        )
    return firsts


def trace_split(model: nn.Module, split_points: List[str]) -> List[nn.Module]:
    """Cut `model` where each named module begins: ``len(split_points) + 1`` chained stages.

    The forward pass is traced symbolically with ``torch.fx`` (no example needed, any batch
    size). Each node goes to the stage of the last split point at or before it; a value made
    in one stage and used in a later one is passed through the stages between, so stage k
    takes exactly what stage k-1 returns. Parameters are shared with `model`, not copied.
    """
    import torch.fx as fx

    try:
        traced = fx.symbolic_trace(model)
    except Exception as err:  # data-dependent control flow, unsupported Python
        raise _refuse_split(
            f"{type(model).__name__}'s forward cannot be traced with torch.fx ({type(err).__name__}:"
            f" {str(err).splitlines()[0] if str(err) else ''})."
        ) from None
    graph = traced.graph
    nodes = list(graph.nodes)
    firsts = _first_nodes(graph, split_points, [n for n, _ in model.named_modules()])
    placeholders = [n for n in nodes if n.op == "placeholder"]
    if len(placeholders) != 1:
        raise _refuse_split(
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
            raise _refuse_split(f"stage {k} of {n_stages} would hold no computation.")
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
            env[node] = stage_graph.node_copy(node, lambda n: env[n])
        if k == n_stages - 1:
            for arg in output_node.all_input_nodes:
                if arg.op == "get_attr" and arg not in env:
                    env[arg] = stage_graph.node_copy(arg)
            stage_graph.output(fx.map_arg(output_node.args[0], lambda n: env[n]))
        else:
            live = [env[v] for v in crossing[k + 1]]
            stage_graph.output(live[0] if len(live) == 1 else tuple(live))
        stage_graph.lint()
        stages.append(fx.GraphModule(traced, stage_graph, class_name=f"Stage{k}"))
    return stages


def stage_inputs(stages: Sequence[nn.Module], k: int, example: torch.Tensor) -> Tuple[torch.Tensor, ...]:
    """What stage k receives for `example`: the earlier stages run on it (no grad)."""
    carry: Any = example
    with torch.no_grad():
        for stage in stages[:k]:
            carry = stage(*carry) if isinstance(carry, tuple) else stage(carry)
    values = carry if isinstance(carry, tuple) else (carry,)
    if not all(isinstance(v, torch.Tensor) for v in values):
        raise _refuse_split(
            f"stage {k} would receive a value that is not a tensor ({[type(v).__name__ for v in values]}), which cannot"
            " be sent between ranks."
        )
    return values
