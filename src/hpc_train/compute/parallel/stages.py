"""Cut a model into consecutive stages on several devices, optionally pipelining micro-batches.

This generalises the two-GPU ResNet split of the seed material (``seq0`` on cuda:0, ``seq1``
on cuda:1) to any number of stages and to automatic boundaries:

* ``balance="params"``: contiguous stages with the largest stage's parameter count as small as
  possible (exact linear partition);
* ``balance="time"``: the same, weighting each layer by its measured forward + backward time
  on one micro-batch (what a pipeline stage spends per micro-batch) in steady state (after an
  untimed warm-up round), measured once on rank 0 and broadcast, so that every rank of a
  distributed run cuts the model at the same layers;
* ``balance=[n1, n2, ...]``: explicit layer counts per stage;
* ``split_points=[name, ...]``: any model, cut where the named modules (``named_modules()``)
  begin, by tracing its forward with ``torch.fx`` (see :func:`trace_split`).

A model that is neither an ``nn.Sequential`` nor a torchvision ResNet is cut automatically when
it is built from a repeated block list (a transformer's ``blocks`` / ``h`` / ``layers``): the
stages are cut between its blocks, the layers before the list joining the first stage and
those after it the last (see :func:`split_block_list`).

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
import inspect
import logging
import sys
import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

import torch
import torch.nn as nn

from hpc_train.compute.runtime.refusal import Refusal

log = logging.getLogger("hpc_train")


def _is_torchvision_resnet(model: nn.Module) -> bool:
    """Without importing torchvision (0.6 s per process): a ResNet instance means it is imported already."""
    resnet = sys.modules.get("torchvision.models.resnet")
    return resnet is not None and isinstance(model, resnet.ResNet)


def flatten_layers(model: nn.Module) -> List[nn.Module]:
    """The model as a list of layers whose composition is the model's forward."""
    if _is_torchvision_resnet(model):
        blocks = [block for layer in (model.layer1, model.layer2, model.layer3, model.layer4) for block in layer]
        return [model.conv1, model.bn1, model.relu, model.maxpool, *blocks, model.avgpool, nn.Flatten(1), model.fc]
    if isinstance(model, nn.Sequential):
        return list(model)
    raise _refuse_unsplittable(model, "")


def _refuse_unsplittable(model: nn.Module, detail: str) -> Refusal:
    """No automatic cut: the user names where the stages begin."""
    return Refusal(
        f"`strategy.split_points`: {type(model).__name__} is neither an nn.Sequential, a torchvision ResNet, nor built"
        f" from a repeated block list{detail}, so it cannot be cut automatically. Fix: name the modules where each new"
        " stage begins, e.g. strategy.split_points=[head] (names as in model.named_modules())."
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


def _synchronize(value: Any) -> None:
    """Wait for a device's queued kernels, so that a timer stops when the work is done (no-op on CPU)."""
    if isinstance(value, torch.Tensor) and value.is_cuda:
        torch.cuda.synchronize(value.device)


def layer_times(layers: Sequence[nn.Module], example: torch.Tensor, rounds: int = 5, warmup: int = 1) -> List[float]:
    """Forward + backward time of each layer on an example batch, in steady state (median over rounds).

    Backward counts because a stage's step is its forward and its backward, and their ratio varies
    along a network (on CPU a late ResNet block's backward costs 2-3x its forward, an early one's
    about 1x): forward time alone leaves the last stage with most of the step.

    Each round runs every layer forward in order, then backward in reverse order with the gradient
    the next layer passed back, as a stage computes; each layer takes a detached copy of the previous
    output, so that its own forward and backward are timed. The first `warmup` rounds are not timed:
    a layer's first calls in a process pay one-off costs (oneDNN primitive creation, the allocator's
    first page faults), which fell on the first layers timed: ResNet-18's stem (128 px, micro-batch
    16) weighed 115-126 ms, once 469, against 85-109 ms steady, and the cut moved forward. Rounds, not
    back-to-back repeats of one layer, so that a burst of other load slows one round of every layer
    rather than every run of one.
    Each layer is timed on a copy, so the model's batch-norm statistics and gradients are untouched.
    """
    probes = copy.deepcopy(list(layers))
    runs: List[List[float]] = [[] for _ in probes]
    for round_index in range(warmup + max(1, rounds)):
        elapsed, inputs, outputs, x = [], [], [], example
        for index, probe in enumerate(probes):
            leaf = x.detach().requires_grad_(index > 0 and x.is_floating_point())
            copied = leaf.clone()  # a non-leaf copy: layers such as ResNet's ReLU work in place
            _synchronize(copied)
            start = time.perf_counter()
            y = probe(copied)
            _synchronize(y)
            elapsed.append(time.perf_counter() - start)
            inputs.append(leaf)
            outputs.append(y)
            x = y
        grad = None
        for index in range(len(probes) - 1, -1, -1):
            y = outputs[index]
            if isinstance(y, torch.Tensor) and y.requires_grad:
                if grad is None or grad.shape != y.shape:
                    grad = torch.ones_like(y)
                _synchronize(grad)
                start = time.perf_counter()
                y.backward(grad)
                _synchronize(y)
                elapsed[index] += time.perf_counter() - start
            grad = inputs[index].grad
        for probe in probes:
            probe.zero_grad(set_to_none=True)  # as between steps: backward allocates fresh gradients
        if round_index >= warmup:
            for index, seconds in enumerate(elapsed):
                runs[index].append(seconds)
    return [sorted(r)[len(r) // 2] + 1e-9 for r in runs]


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
    """Layer counts per stage for a flattened model (ResNet, nn.Sequential)."""
    return balanced_counts(
        len(layers),
        stages,
        balance,
        example,
        lambda: [float(sum(p.numel() for p in layer.parameters())) for layer in layers],
        lambda: layer_times(layers, example),
        f"the model has {len(layers)} layers",
        "layer",
    )


def balanced_counts(
    n: int,
    stages: int,
    balance: Union[str, Sequence[int]],
    example: Optional[torch.Tensor],
    param_weights: Callable[[], List[float]],
    time_weights: Callable[[], List[float]],
    what: str,
    unit: str,
) -> List[int]:
    """Counts of `n` consecutive units (layers or blocks) per stage: explicit, by parameters, or by measured time.

    Time is measured on rank 0 only and broadcast (:func:`agree_on_counts`), so that every rank cuts alike.
    `what` (e.g. "the model has 12 layers") and `unit` word the refusals.
    """
    if stages > n:
        raise Refusal(
            f"`strategy.stages`: {what} to cut, fewer than {stages} stages. Fix: use at most strategy.stages={n}."
        )
    if not isinstance(balance, str):
        counts = [int(c) for c in balance]
        if len(counts) != stages or sum(counts) != n or min(counts) < 1:
            raise Refusal(
                f"`strategy.balance`: {counts} must list {stages} positive {unit} counts summing to {n}. Fix:"
                f" give {stages} numbers that add up to {n}, or use strategy.balance=params."
            )
        return counts
    if balance == "time":
        if example is None:
            raise ValueError("balance=time needs an example batch")
        return agree_on_counts(lambda: partition(time_weights(), stages))
    return partition(param_weights(), stages)


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
    """The model as consecutive stage modules: traced at `split_points`, else cut automatically and balanced.

    A ResNet or nn.Sequential is flattened into layers; any other model is cut between the blocks of
    its repeated block list (a transformer's), as only there is a cut both automatic and balanced.
    """
    if split_points:
        groups = trace_split(model, [str(name) for name in split_points])
    elif _is_torchvision_resnet(model) or isinstance(model, nn.Sequential):
        groups = _flattened_groups(model, stages, balance, example)
    else:
        groups = split_block_list(model, stages, balance, example)
    refuse_parameters_shared_across_stages(model, groups)
    return groups


def _flattened_groups(
    model: nn.Module, stages: int, balance: Union[str, Sequence[int]], example: Optional[torch.Tensor]
) -> List[nn.Module]:
    """A ResNet or nn.Sequential as consecutive nn.Sequential stages of its layers."""
    layers = flatten_layers(model)
    groups, start = [], 0
    for count in stage_counts(layers, stages, balance, example):
        groups.append(nn.Sequential(*layers[start : start + count]))
        start += count
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
                    " would train apart). Fix: train with strategy=ddp (no split: language models tie the token"
                    " embedding and the output layer, which sit at the two ends of the model, so no cut keeps them in"
                    " one stage), cut the model so that every layer using it falls in one stage"
                    " (strategy.balance=[n1, n2, ...] or strategy.split_points=[...]), or untie the weights."
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


# -- automatic stages for models built from a repeated block list ------------------------------
@dataclass
class BlockList:
    """The repeated block list a model is cut along: ``model.get_submodule(name)``, e.g. ViT's ``blocks``."""

    name: str
    blocks: nn.Module  # an nn.ModuleList or nn.Sequential of 2+ children of one class

    @property
    def describe(self) -> str:
        return f"{self.name!r} ({len(self.blocks)} x {type(self.blocks[0]).__name__})"


def _count(module: nn.Module) -> int:
    """Unique parameters (a tied weight counts once)."""
    return sum(p.numel() for p in module.parameters())


def find_block_list(model: nn.Module) -> BlockList:
    """The model's repeated block list: the nn.ModuleList/nn.Sequential of 2+ same-class children with the
    most parameters, which must hold more than half of the model's (else cuts between its blocks could
    not balance the stages). Refused when there is none.
    """
    candidates = [
        BlockList(name, module)
        for name, module in model.named_modules()
        if name
        and isinstance(module, (nn.ModuleList, nn.Sequential))
        and len(module) >= 2
        and len({type(child) for child in module}) == 1
    ]
    if not candidates:
        raise _refuse_unsplittable(model, " (an nn.ModuleList or nn.Sequential of 2 or more blocks of one class)")
    best = max(candidates, key=lambda c: _count(c.blocks))
    total, held = _count(model), _count(best.blocks)
    if 2 * held <= total:
        share = f"{100 * held / total:.0f}%" if total else "none"
        raise _refuse_unsplittable(
            model,
            f" holding most of its parameters (its largest, {best.describe}, holds only {share} of them: cuts"
            " between its blocks could not balance the stages)",
        )
    return best


def block_param_weights(model: nn.Module, found: BlockList) -> List[float]:
    """Parameters per block; those registered before the list count for the first block (they join the first
    stage), those after it for the last.
    """
    weights = [float(_count(block)) for block in found.blocks]
    inside = {id(p) for p in found.blocks.parameters()}
    past_list = False
    for param in model.parameters():  # unique, in registration order
        if id(param) in inside:
            past_list = True
        else:
            weights[-1 if past_list else 0] += param.numel()
    return weights


def block_inputs(model: nn.Module, found: BlockList, example: torch.Tensor) -> List[Tuple[tuple, dict]]:
    """The (args, kwargs) each block receives on `example`: a block's real input is only known inside the forward.

    One no-grad forward in eval mode (no dropout draws, no batch-norm statistics updated); every module's
    training flag is restored afterwards.
    """
    seen: Dict[int, Tuple[tuple, dict]] = {}

    def hook(index: int) -> Callable[..., None]:
        def record(module: nn.Module, args: tuple, kwargs: dict) -> None:
            seen.setdefault(index, (args, kwargs))  # the first call (a block called twice is timed once)

        return record

    handles = [block.register_forward_pre_hook(hook(i), with_kwargs=True) for i, block in enumerate(found.blocks)]
    modes = [(module, module.training) for module in model.modules()]
    try:
        model.eval()
        with torch.no_grad():
            model(example)
    finally:
        for handle in handles:
            handle.remove()
        for module, mode in modes:
            module.training = mode
    missing = [f"{found.name}.{i}" for i in range(len(found.blocks)) if i not in seen]
    if missing:
        raise _refuse_split(f"the forward pass never calls {', '.join(missing)}.")
    return [seen[i] for i in range(len(found.blocks))]


def _first_tensor(value: Any) -> Optional[torch.Tensor]:
    """A block's main output (blocks may return a tuple, the hidden state first)."""
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, (tuple, list)):
        return next((v for v in value if isinstance(v, torch.Tensor)), None)
    return None


def _block_run(probe: nn.Module, args: tuple, kwargs: dict) -> float:
    """One forward + backward of a block on its real input, the hidden state a fresh non-leaf copy."""
    head = args[:1]
    if head and isinstance(head[0], torch.Tensor):
        head = (head[0].detach().requires_grad_(head[0].is_floating_point()).clone(),)
        _synchronize(head[0])
    start = time.perf_counter()
    y = _first_tensor(probe(*head, *args[1:], **kwargs))
    if y is not None and y.requires_grad:
        y.backward(torch.ones_like(y))
    _synchronize(y)
    return time.perf_counter() - start


def block_times(
    model: nn.Module, found: BlockList, example: torch.Tensor, rounds: int = 5, warmup: int = 1
) -> List[float]:
    """Forward + backward time of each block (what a pipeline stage spends per micro-batch), in steady state.

    As in :func:`layer_times`: on copies, untimed warm-up rounds first (the first calls of a process are
    slow and would weigh the first block), then rounds over all blocks, median per block.
    """
    inputs = block_inputs(model, found, example)
    probes = copy.deepcopy(list(found.blocks))
    runs: List[List[float]] = [[] for _ in probes]
    for round_index in range(warmup + max(1, rounds)):
        for index, (probe, (args, kwargs)) in enumerate(zip(probes, inputs)):
            seconds = _block_run(probe, args, kwargs)
            probe.zero_grad(set_to_none=True)
            if round_index >= warmup:
                runs[index].append(seconds)
    return [sorted(r)[len(r) // 2] + 1e-9 for r in runs]


def split_block_list(
    model: nn.Module, stages: int, balance: Union[str, Sequence[int]], example: Optional[torch.Tensor] = None
) -> List[nn.Module]:
    """`model` cut between the blocks of its repeated block list into `stages` balanced stages.

    The cut is traced (:func:`trace_split`) at the first block of every stage but the first, so the
    layers before the list (embeddings) join the first stage and those after it (norm, head) the last.
    """
    found = find_block_list(model)
    counts = balanced_counts(
        len(found.blocks),
        stages,
        balance,
        example,
        lambda: block_param_weights(model, found),
        lambda: block_times(model, found, example),
        f"{type(model).__name__}'s block list {found.name!r} has {len(found.blocks)} blocks",
        "block",
    )
    starts = [sum(counts[:k]) for k in range(1, len(counts))]
    points = [f"{found.name}.{i}" for i in starts]
    label = balance if isinstance(balance, str) else list(balance)
    log.info(
        "cutting %s's block list %s into %d stages at %s (balance=%s: %s blocks)",
        type(model).__name__,
        found.describe,
        len(counts),
        ", ".join(points) or "no block",
        label,
        " + ".join(str(c) for c in counts),
    )
    return trace_split(model, points)


# -- splitting any model at named modules -----------------------------------------------------
def _refuse_split(problem: str) -> Refusal:
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
            raise _refuse_split(f"the model has no module {name!r}{hint}.")
        index = next((i for i, n in enumerate(nodes) if _runs_inside(n, name)), None)
        if index is None:
            raise _refuse_split(f"the traced forward pass never calls module {name!r}.")
        firsts.append(index)
    if firsts != sorted(firsts) or len(set(firsts)) != len(firsts):
        raise _refuse_split(
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
        raise _refuse_split(f"{type(model).__name__}.forward names no input, but a split model is called with one.")
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
            raise _refuse_split(f"{node.target} is used by the forward pass; a split model is called with one tensor.")
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
    import torch.fx as fx

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
    import torch.fx as fx
    from torch.fx.graph import _PyTreeCodeGen
    from torch.utils import _pytree as pytree

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
    import torch.fx as fx

    graph = _trace(model)
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
        raise _refuse_split(
            f"stage {k} would receive a value that is not a tensor ({[type(v).__name__ for v in values]}), which cannot"
            " be sent between ranks."
        )
    return values
