"""Cut a model into consecutive stages on several devices, optionally pipelining micro-batches.

This generalises the two-GPU ResNet split of the seed material (``seq0`` on cuda:0, ``seq1``
on cuda:1) to any number of stages and to automatic boundaries:

* ``balance="params"``: contiguous stages with the largest stage's parameter count as small as
  possible (exact linear partition);
* ``balance="time"``: the same, weighting each layer by its measured forward time;
* ``balance=[n1, n2, ...]``: explicit layer counts per stage.

With ``chunks > 1`` the batch is cut into micro-batches pushed through the stages in fill-drain
order: at clock tick t, stage s runs micro-batch t - s, so on GPUs (asynchronous kernels) stage
s+1 works on micro-batch j-1 while stage s works on j. Batch norm then sees per-micro-batch
statistics in training (``batchnorm=keep``, the default, like the seed); ``freeze`` puts every
batch-norm layer in eval mode (running statistics, exact equivalence to the unsplit model).
"""

from __future__ import annotations

import time
from typing import List, Sequence, Union

import torch
import torch.nn as nn
from torchvision.models.resnet import ResNet


def flatten_layers(model: nn.Module) -> List[nn.Module]:
    """The model as a list of layers whose composition is the model's forward."""
    if isinstance(model, ResNet):
        blocks = [block for layer in (model.layer1, model.layer2, model.layer3, model.layer4) for block in layer]
        return [model.conv1, model.bn1, model.relu, model.maxpool, *blocks, model.avgpool, nn.Flatten(1), model.fc]
    if isinstance(model, nn.Sequential):
        return list(model)
    raise ValueError(f"cannot split {type(model).__name__}: give an nn.Sequential or a torchvision ResNet")


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
    """Forward time of each layer on an example batch (median of a few runs, CPU or one device)."""
    times, x = [], example
    with torch.no_grad():
        for layer in layers:
            runs = []
            for _ in range(repeats):
                start = time.perf_counter()
                y = layer(x)
                if y.is_cuda:
                    torch.cuda.synchronize(y.device)
                runs.append(time.perf_counter() - start)
            times.append(sorted(runs)[len(runs) // 2] + 1e-9)
            x = y
    return times


def stage_counts(layers: Sequence[nn.Module], stages: int, balance: Union[str, Sequence[int]], example: torch.Tensor = None) -> List[int]:
    if not isinstance(balance, str):
        counts = [int(c) for c in balance]
        if len(counts) != stages or sum(counts) != len(layers) or min(counts) < 1:
            raise ValueError(f"strategy.balance={counts} must list {stages} positive layer counts summing to {len(layers)}")
        return counts
    if balance == "time":
        if example is None:
            raise ValueError("balance=time needs an example batch")
        return partition(layer_times(layers, example), stages)
    return partition([float(sum(p.numel() for p in layer.parameters())) for layer in layers], stages)


class StagedModel(nn.Module):
    """Consecutive stages on consecutive devices; ``chunks > 1`` pipelines micro-batches."""

    def __init__(self, stages: Sequence[nn.Sequential], devices: Sequence[torch.device], chunks: int = 1, freeze_batchnorm: bool = False) -> None:
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

    def _run(self, x: torch.Tensor) -> torch.Tensor:
        for stage, device in zip(self.stages, self.devices):
            x = stage(x.to(device, non_blocking=True))
        return x

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.chunks <= 1:
            return self._run(x)
        micro = list(x.split(-(-x.shape[0] // self.chunks)))
        n_stages = len(self.stages)
        current: List[torch.Tensor] = [None] * len(micro)  # type: ignore[list-item]
        outputs: List[torch.Tensor] = [None] * len(micro)  # type: ignore[list-item]
        # Fill-drain: tick t runs stage s on micro-batch t - s, last stage first, so that the
        # kernels of stage s+1 (micro-batch j-1) are queued before those of stage s (micro-batch j).
        for tick in range(len(micro) + n_stages - 1):
            for s in range(min(tick, n_stages - 1), -1, -1):
                j = tick - s
                if 0 <= j < len(micro):
                    source = micro[j] if s == 0 else current[j]
                    current[j] = self.stages[s](source.to(self.devices[s], non_blocking=True))
                    if s == n_stages - 1:
                        outputs[j] = current[j]
        return torch.cat(outputs)


def build_staged(model: nn.Module, devices: Sequence[torch.device], stages: int, balance, chunks: int, freeze_batchnorm: bool, example: torch.Tensor = None) -> StagedModel:
    layers = flatten_layers(model)
    counts = stage_counts(layers, stages, balance, example)
    groups, start = [], 0
    for count in counts:
        groups.append(nn.Sequential(*layers[start : start + count]))
        start += count
    return StagedModel(groups, [devices[i % len(devices)] for i in range(stages)], chunks, freeze_batchnorm)
