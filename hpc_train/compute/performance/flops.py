"""The FLOPs of one training step, counted by torch.utils.flop_counter over a real eager step.

The counter sees the matrix products and convolutions this rank runs (forward, the recomputation of activation
checkpointing, backward) with the shapes it runs them on: its own share of a sharded or split model, its own micro-
batches. It leaves out element-wise work (activations, norms, the loss, the optimizer), which is small next to the
matrix products; a gradient nobody asks for (an input that needs no grad) is not computed, so not counted.
"""

from __future__ import annotations

import contextlib
from typing import Iterator, Optional

from torch.utils.flop_counter import FlopCounterMode


class StepFlops:
    """Counts the first step of an attempt once; :attr:`per_step` afterwards (None until then)."""

    def __init__(self) -> None:
        self.per_step: Optional[int] = None

    @property
    def pending(self) -> bool:
        return self.per_step is None

    @contextlib.contextmanager
    def counting(self) -> Iterator[None]:
        """Around the step's forward and backward, on the first step only (a no-op on every later one)."""
        if not self.pending:
            yield
            return
        counter = FlopCounterMode(display=False)
        with counter:
            yield
        self.per_step = int(counter.get_total_flops())
