"""Where to cut a model: its layers, their measured times, balanced stage sizes agreed by every rank, and a
repeated block list found and timed (what ``strategy.balance`` decides)."""

from __future__ import annotations

import copy
import sys
import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

import torch
import torch.distributed as dist
import torch.nn as nn

from hpc_train.compute.parallel.tracing import split_points_refusal
from hpc_train.compute.runtime.refusal import Refusal

STAGES_KEY = "strategy.stages"  # the key that sets the stage count of the pipeline strategies


def is_torchvision_resnet(model: nn.Module) -> bool:
    """Without importing torchvision (0.6 s per process): a ResNet instance means it is imported already."""
    resnet = sys.modules.get("torchvision.models.resnet")
    return resnet is not None and isinstance(model, resnet.ResNet)


def flatten_layers(model: nn.Module) -> List[nn.Module]:
    """The model as a list of layers whose composition is the model's forward."""
    if is_torchvision_resnet(model):
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
    return max(1, -(-batch // chunks))


def micro_batch(example: torch.Tensor, chunks: int) -> torch.Tensor:
    """The first micro-batch of `example` cut into `chunks` (what one pipeline step of a stage sees)."""
    return example[: micro_batch_size(example.shape[0], chunks)]


def agree_on_counts(measure: Callable[[], List[int]]) -> List[int]:
    """Layer counts measured by rank 0 of the default process group, on every rank (measured here without one).

    Timings differ between processes, so ranks that measured their own layer times could cut the
    model at different layers: the pipeline's stages would not fit and DDP replicas would differ.
    """
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return list(measure())
    box: List[Any] = [list(measure()) if dist.get_rank() == 0 else None]
    dist.broadcast_object_list(box, src=0)
    return list(box[0])


def stage_counts(
    layers: Sequence[nn.Module],
    stages: int,
    balance: Union[str, Sequence[int]],
    example: torch.Tensor = None,
    stages_key: str = STAGES_KEY,
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
        stages_key,
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
    stages_key: str = STAGES_KEY,
) -> List[int]:
    """Counts of `n` consecutive units (layers or blocks) per stage: explicit, by parameters, or by measured time.

    Time is measured on rank 0 only and broadcast (:func:`agree_on_counts`), so that every rank cuts alike.
    `what` (e.g. "the model has 12 layers") and `unit` word the refusals; `stages_key` is the key that set the
    stage count (strategy.stages; a mesh's strategy.pp).
    """
    if stages > n:
        raise Refusal(f"`{stages_key}`: {what} to cut, fewer than {stages} stages. Fix: use at most {stages_key}={n}.")
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


def find_block_list(model: nn.Module, most: bool = True) -> BlockList:
    """The model's repeated block list: the nn.ModuleList/nn.Sequential of 2+ same-class children with the
    most parameters, which must hold more than half of the model's where `most` (pipeline stages: else cuts between
    its blocks could not balance them; FSDP's units need no such share). Refused when there is none.
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
    if most and 2 * held <= total:
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
        raise split_points_refusal(f"the forward pass never calls {', '.join(missing)}.")
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
