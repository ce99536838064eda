"""balance=time weighs each layer by its steady forward + backward time on the micro-batch.

Layers here cost time on a fake clock (partitioning.time is replaced), so the assertions are exact and independent of
the machine's speed and load. Before the fix a layer's first calls in a process were timed (median of 3
back-to-back runs, the first two slow for ResNet-18's stem) and weighed the first stage, which was cut too short.
"""

from __future__ import annotations

import types
from typing import List

import pytest
import torch
import torch.nn as nn

from hpc_train.compute.parallel import partitioning
from hpc_train.compute.parallel.partitioning import block_times, find_block_list, layer_times, stage_counts
from hpc_train.compute.parallel.staged_model import build_staged


class Clock:
    """Seconds that only advance when a fake layer computes."""

    def __init__(self) -> None:
        self.now = 0.0
        self.calls = 0  # forward calls of every fake layer, in order (a burst of load is a run of calls)
        self.burst: range = range(0)
        self.burst_cost = 0.0

    def spend(self, seconds: float) -> None:
        self.now += seconds + (self.burst_cost if self.calls in self.burst else 0.0)
        self.calls += 1


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    clock = Clock()
    monkeypatch.setattr(partitioning, "time", types.SimpleNamespace(perf_counter=lambda: clock.now))
    return clock


class Cost(nn.Module):
    """A layer with a parameter that costs `steady` seconds per forward + backward, `first` on its first
    `slow_calls` calls in the process (shared by its copies, as oneDNN's primitive cache and the allocator are).
    """

    def __init__(self, clock: Clock, steady: float, first: float = 0.0, slow_calls: int = 0) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.ones(()))
        self.clock, self.steady, self.first, self.slow_calls = clock, steady, first, slow_calls
        self.seen = [0]  # one list for the layer and its deep copies: deepcopy keeps the memo per call
        self.batch_sizes: List[int] = []

    def __deepcopy__(self, memo: dict) -> "Cost":
        twin = Cost(self.clock, self.steady, self.first, self.slow_calls)
        twin.seen, twin.batch_sizes = self.seen, self.batch_sizes  # the process-wide state is shared
        return twin

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.batch_sizes.append(x.shape[0])
        self.clock.spend(self.first if self.seen[0] < self.slow_calls else self.steady)
        self.seen[0] += 1
        return x * self.scale


def test_first_calls_in_a_process_do_not_weigh_a_layer(clock: Clock) -> None:
    """The stem's first calls were slow (oneDNN primitives, first page faults): they must not move the cut.

    Steady, [stem | a | b] costs 0.001 / 0.05 / 0.05 s: best split [2, 1]. Weighted by its first calls (1 s
    for 2 calls, as ResNet-18's conv1 measured 2 slow runs of 3 in a fresh process) it would be [1, 2].
    """
    layers = [Cost(clock, 0.001, first=1.0, slow_calls=2), Cost(clock, 0.05), Cost(clock, 0.05)]
    x = torch.ones(4, 3)
    assert layer_times(layers, x) == pytest.approx([0.001, 0.05, 0.05], abs=1e-6)
    clock.__init__()
    for layer in layers:
        layer.seen[0] = 0  # a fresh process again
    assert stage_counts(layers, 2, "time", x) == [2, 1]


@pytest.mark.parametrize("start", range(0, 14))
def test_a_burst_of_other_load_slows_every_layer_once_not_one_layer_always(clock: Clock, start: int) -> None:
    """Three consecutive slow calls, wherever they fall, leave every layer's median at its steady time.

    Back-to-back repeats of one layer put a whole burst on that layer (3 of 3 runs), which then weighs its stage.
    """
    clock.burst, clock.burst_cost = range(start, start + 3), 1.0
    layers = [Cost(clock, 0.01) for _ in range(4)]
    assert layer_times(layers, torch.ones(2, 3)) == pytest.approx([0.01] * 4, abs=1e-6)


def test_layers_are_timed_on_one_micro_batch(clock: Clock) -> None:
    """A stage computes on batch / chunks samples, so balance=time times the layers on a micro-batch of that size."""
    layers = [Cost(clock, 0.01) for _ in range(4)]
    build_staged(
        nn.Sequential(*layers),
        [torch.device("cpu")],
        2,
        "time",
        chunks=4,
        freeze_batchnorm=False,
        example=torch.ones(16, 3),
    )
    assert {size for layer in layers for size in layer.batch_sizes} == {4}


class Blocks(nn.Module):
    """A model built from a repeated block list (cut between its blocks, as a transformer's)."""

    def __init__(self, clock: Clock) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(
            [Cost(clock, 0.01, first=1.0, slow_calls=3)] + [Cost(clock, 0.01) for _ in range(3)]
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return x


def test_block_times_skip_the_first_calls_too(clock: Clock) -> None:
    """The block path times the same way: the first block's first calls (the input capture's among them) are not
    weighed."""
    model = Blocks(clock)
    assert block_times(model, find_block_list(model), torch.ones(2, 3)) == pytest.approx([0.01] * 4, abs=1e-6)
