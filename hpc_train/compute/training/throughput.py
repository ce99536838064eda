"""The training loop's throughput: samples (and a user step's tokens) per second of the timed optimizer steps."""

from __future__ import annotations

import time
from typing import Callable, Optional

import torch


class Throughput:
    """Samples (and a user step's tokens) per second over the optimizer steps after the warm-up, evaluation
    excluded. A step's samples are the global batch (``trainer.batch_size``), whatever the accumulation."""

    def __init__(
        self, first_step: int, total: int, warmup_steps: int, global_batch: int, sync: Callable[[], None]
    ) -> None:
        self.warmup = first_step + min(warmup_steps, max(0, total - first_step - 1))
        self.global_batch, self.sync = global_batch, sync
        self.samples, self.seconds, self.started = 0, 0.0, None
        self.tokens: Optional[torch.Tensor] = None  # this rank's tokens over the timed steps (a user step's count)

    def step_done(self, step: int, tokens: Optional[torch.Tensor] = None) -> None:
        if step == self.warmup:
            self.sync()
            self.started = time.perf_counter()
        elif step > self.warmup:
            self.samples += self.global_batch
            if tokens is not None:
                tokens = tokens.detach().double()
                self.tokens = tokens if self.tokens is None else self.tokens + tokens
            if self.started is None:
                self.started = time.perf_counter()

    def pause(self) -> None:
        if self.started is not None:
            self.seconds += time.perf_counter() - self.started
            self.started = None

    def resume(self, step: int) -> None:
        if step > self.warmup:
            self.started = time.perf_counter()

    @property
    def elapsed(self) -> float:
        """Timed seconds so far, the running stretch included."""
        return self.seconds + (time.perf_counter() - self.started if self.started is not None else 0.0)

    def rate(self, amount: float, elapsed: Optional[float] = None) -> float:
        """`amount` (of the timed steps) per timed second (`elapsed`: one reading shared by several rates)."""
        elapsed = self.elapsed if elapsed is None else elapsed
        return amount / elapsed if elapsed > 0 else 0.0

    @property
    def samples_per_sec(self) -> float:
        return self.rate(self.samples)
