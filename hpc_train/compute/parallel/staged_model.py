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

import logging
from typing import Any, Dict, List, Optional, Sequence, Union

import torch
import torch.nn as nn

from hpc_train.compute.parallel.partitioning import (
    STAGES_KEY,
    balanced_counts,
    block_param_weights,
    block_times,
    find_block_list,
    flatten_layers,
    is_torchvision_resnet,
    micro_batch,
    micro_batch_size,
    stage_counts,
)
from hpc_train.compute.parallel.tracing import trace_split
from hpc_train.compute.runtime.refusal import Refusal

log = logging.getLogger("hpc_train")


class StagedModel(nn.Module):
    """Consecutive stages on consecutive devices; ``chunks > 1`` pipelines micro-batches."""

    def __init__(
        self,
        stages: Sequence[nn.Sequential],
        devices: Sequence[torch.device],
        chunks: int,
        freeze_batchnorm: bool,
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
    model: nn.Module,
    stages: int,
    balance,
    split_points: Optional[Sequence[str]] = None,
    example: torch.Tensor = None,
    named: bool = False,
    stages_key: str = STAGES_KEY,
) -> List[nn.Module]:
    """The model as consecutive stage modules: traced at `split_points`, else cut automatically and balanced.

    A ResNet or nn.Sequential is flattened into layers; any other model is cut between the blocks of
    its repeated block list (a transformer's), as only there is a cut both automatic and balanced.
    `named`: every stage is traced from the model, so its parameters keep the model's own names (a
    sharded checkpoint of stages then loads into any other cut, or the whole model). `stages_key`: the key that set
    `stages`, named when the model has fewer layers or blocks than that.
    """
    if split_points:
        groups = trace_split(model, [str(name) for name in split_points])
    elif is_torchvision_resnet(model) or isinstance(model, nn.Sequential):
        cut = _flattened_cut(model, stages, balance, example, stages_key)
        if named:  # traced from the model at the first layer of every stage but the first
            names = {id(module): name for name, module in model.named_modules()}
            groups = trace_split(model, [names[id(layers[0])] for layers in cut[1:]])
        else:
            groups = [nn.Sequential(*layers) for layers in cut]
    else:
        groups = split_block_list(model, stages, balance, example, stages_key)
    refuse_parameters_shared_across_stages(model, groups)
    return groups


def _flattened_cut(
    model: nn.Module,
    stages: int,
    balance: Union[str, Sequence[int]],
    example: Optional[torch.Tensor],
    stages_key: str = STAGES_KEY,
) -> List[List[nn.Module]]:
    """A ResNet's or nn.Sequential's layers cut into consecutive stages, balanced as `balance` says."""
    layers = flatten_layers(model)
    cut, start = [], 0
    for count in stage_counts(layers, stages, balance, example, stages_key):
        cut.append(layers[start : start + count])
        start += count
    return cut


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


def split_block_list(
    model: nn.Module,
    stages: int,
    balance: Union[str, Sequence[int]],
    example: Optional[torch.Tensor] = None,
    stages_key: str = STAGES_KEY,
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
        stages_key,
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
