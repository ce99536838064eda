"""The FLOPs of one training step, counted with torch.utils.flop_counter's formulas over a real eager step.

It sees the matrix products and convolutions this rank runs (forward, the recomputation of activation checkpointing,
backward) with the shapes it runs them on: its own share of a sharded or split model, its own micro-batches. A
tensor-parallel product is counted on the shard this rank holds (a DTensor's whole shape would count it on every
rank of its group). It leaves out element-wise work (activations, norms, the loss, the optimizer), which is small next
to the matrix products, and attention on a CPU (torch has no formula for its CPU kernel); a gradient nobody asks for
(an input that needs no grad) is not computed, so not counted.
"""

from __future__ import annotations

import contextlib
from functools import partial
from typing import Any, Iterator, Optional

from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_map
from torch.utils.flop_counter import flop_registry

try:
    from torch.distributed.tensor import DTensor
except ImportError:  # torch < 2.5 keeps it private
    from torch.distributed._tensor import DTensor


def _local(value: Any) -> Any:
    return value._local_tensor if isinstance(value, DTensor) else value


class _Counter(TorchDispatchMode):
    """torch's FLOP formulas (torch.utils.flop_counter.flop_registry) summed over the operations run inside it.

    FlopCounterMode does the same and also attributes each count to the module running it, with backward hooks that
    pipelining's stage-by-stage ``autograd.grad`` does not support; only the total is wanted here. A DTensor's
    operation is counted on the shard this rank holds."""

    def __init__(self) -> None:
        super().__init__()
        self.total = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        packet = func._overloadpacket
        if packet not in flop_registry:  # a composite operation: counted by what it decomposes into
            with self:  # the mode is off inside its own handler: on again for the parts
                decomposed = func.decompose(*args, **kwargs)
            if decomposed is not NotImplemented:
                return decomposed
        out = func(*args, **kwargs)
        if packet in flop_registry:
            local = partial(tree_map, _local)
            self.total += int(flop_registry[packet](*local(args), **local(kwargs), out_val=local(out)))
        return out


class StepFlops:
    """Counts the second step of an attempt (the first sets up what runs once: a pipeline's shapes, compiled graphs,
    lazy modules); :attr:`per_step` afterwards (None until then)."""

    def __init__(self) -> None:
        self.per_step: Optional[int] = None
        self._steps = 0  # steps seen by counting()

    @property
    def due(self) -> bool:
        """The next step is the one counted."""
        return self.per_step is None and self._steps == 1

    @contextlib.contextmanager
    def counting(self) -> Iterator[None]:
        """Around every step's forward and backward: counts the one that is due, passes the others through."""
        due = self.due
        self._steps += 1
        if not due:
            yield
            return
        counter = _Counter()
        with counter:
            yield
        self.per_step = counter.total
