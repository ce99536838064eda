"""The FLOPs of one training step, counted by torch.utils.flop_counter over a real eager step.

The counter sees the matrix products and convolutions this rank runs (forward, the recomputation of activation
checkpointing, backward) with the shapes it runs them on: its own share of a sharded or split model, its own micro-
batches. A tensor-parallel product is counted on the shard this rank holds (the counter alone would see a DTensor's
whole shape on every rank of its group). It leaves out element-wise work (activations, norms, the loss, the
optimizer), which is small next to the matrix products; a gradient nobody asks for (an input that needs no grad) is
not computed, so not counted.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator, Optional

from torch.utils._pytree import tree_map
from torch.utils.flop_counter import FlopCounterMode

try:
    from torch.distributed.tensor import DTensor
except ImportError:  # torch < 2.5 keeps it private
    from torch.distributed._tensor import DTensor


def _local(value: Any) -> Any:
    return value._local_tensor if isinstance(value, DTensor) else value


class _LocalShapes(FlopCounterMode):
    """Counts an operation on DTensors by the shards this rank holds, where it computes."""

    def _count_flops(self, func_packet: Any, out: Any, args: Any, kwargs: Any) -> Any:
        super()._count_flops(func_packet, tree_map(_local, out), tree_map(_local, args), tree_map(_local, kwargs))
        return out


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
        counter = _LocalShapes(display=False)
        with counter:
            yield
        self.per_step = int(counter.get_total_flops())
