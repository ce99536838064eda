"""torch's memory trackers (``torch.distributed._tools``) as the estimate uses them: the one that fits the model, its
peak snapshot per category.

``FSDPMemTracker`` files FSDP2's all-gathered parameters and reduce-scatter buffers apart; it takes one forward per
unit and step. ``MemTracker`` takes the rest: a pipeline's micro-batches and accumulated ones run the model several
times a step, which it refuses as a new iteration unless its per-module statistics (which the estimate does not read)
are cleared at each root forward: :func:`tracker_for` does that. Its global peak, the estimate's figure, is kept.

Both skip what DTensor's sharding propagation makes: to learn an operation's output shape it runs the operation on
fake tensors of the arguments' global (unsharded) shapes. On real tensors that is in a fake mode of its own, which
the trackers skip; in the estimate it is in the estimate's own fake mode, which they track, so a foreach norm over
FSDP2's sharded gradients counted every gradient whole at once (the model's fp32 size, once per step the propagation
is not cached). The trackers here count nothing while the propagation runs (:func:`_untracked_propagation`). And
they keep the global peak alone, not each module's (which the estimate does not read).
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Dict, Iterator, Mapping, Type

import torch
import torch.nn as nn
from torch.distributed.tensor._sharding_prop import ShardingPropagator

from hpc_train.compute.fit.breakdown import TOTAL
from hpc_train.compute.runtime.refusal import Refusal


def _classes() -> tuple[Type[Any], Type[Any]]:
    """torch's (MemTracker, FSDPMemTracker), or a refusal naming the torch that lacks them."""
    try:
        # torch's tools, which an older torch lacks: refused below, naming the torch
        from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
        from torch.distributed._tools.mem_tracker import MemTracker
    except ImportError as error:
        raise Refusal(
            f"the memory estimate needs torch.distributed._tools' memory trackers, which torch {torch.__version__}"
            f" does not have ({error}). Fix: run the estimate with torch 2.6 or newer (the ranks may keep their own)."
        ) from None
    return MemTracker, FSDPMemTracker


def tracker_for(model: nn.Module, optimizer: torch.optim.Optimizer, batch: Any, once: bool) -> Any:
    """FSDPMemTracker where FSDP2 wraps the model and each unit runs `once` a step, else a MemTracker that takes
    micro-batches (it files FSDP2's gathered parameters as activations); the model, the optimizer and the batch,
    made before it, tracked too, and a simulated DDP's gradient buckets as gradients."""
    mem_tracker, fsdp_tracker = _classes()
    from torch.distributed.fsdp import FSDPModule  # ~0.6 s: only the estimate pays it here

    if once and isinstance(model, FSDPModule):
        tracker = _skipping_propagation(fsdp_tracker)(model, optimizer)
        tracker.track_external(batch)
        return tracker
    tracker = _skipping_propagation(_micro_batches(mem_tracker))()
    tracker.track_external(model, optimizer, batch)
    for bucket in getattr(model, "gradient_buckets", ()):  # the simulated DDP's (hpc_train.compute.fit.replicas)
        tracker._update_and_maybe_create_winfos(bucket, _gradient_kind())
    return tracker


def _gradient_kind() -> Any:
    """MemTracker's category of gradients."""
    from torch.distributed._tools.mem_tracker import _MemRefType  # torch's tools: _classes refused a torch without

    return _MemRefType.GRAD


class _Propagating:
    """How deep this process is in DTensor's sharding propagation (0: not in it)."""

    depth = 0


@contextlib.contextmanager
def _untracked_propagation() -> Iterator[None]:
    """DTensor's propagation of an operation's output shape (``ShardingPropagator._propagate_tensor_meta_non_cached``,
    where it runs the operation on global-shape fake tensors) counted by :class:`_Propagating`, for the block."""
    original = ShardingPropagator._propagate_tensor_meta_non_cached

    def propagate(propagator: Any, schema: Any) -> Any:
        _Propagating.depth += 1
        try:
            return original(propagator, schema)
        finally:
            _Propagating.depth -= 1

    ShardingPropagator._propagate_tensor_meta_non_cached = propagate  # type: ignore[method-assign]
    try:
        yield
    finally:
        ShardingPropagator._propagate_tensor_meta_non_cached = original  # type: ignore[method-assign]


def _skipping_propagation(tracker_type: Type[Any]) -> Type[Any]:
    class PropagationSkippingTracker(tracker_type):  # type: ignore[misc, valid-type]
        """The tracker, blind to the tensors DTensor's sharding propagation makes (they hold no memory)."""

        def __enter__(self) -> Any:
            entered = _untracked_propagation()
            entered.__enter__()
            self.__dict__.setdefault("_propagations", []).append(entered)
            return super().__enter__()

        def __exit__(self, *args: Any) -> None:
            try:
                super().__exit__(*args)
            finally:
                self._propagations.pop().__exit__(None, None, None)

        def __torch_dispatch__(self, func: Callable[..., Any], types: Any, args: Any = (), kwargs: Any = None) -> Any:
            if _Propagating.depth:
                return func(*args, **(kwargs or {}))
            return super().__torch_dispatch__(func, types, args, kwargs)

        def _update_peak_stats(self, peak_state: Any) -> None:
            """The global peak alone: torch's also walks every module's statistics at every operation (most of
            the estimate's time on a large model), which the estimate does not read."""
            for device, snapshot in self._curr_mem_snap.items():
                if self._peak_mem.get(device, 0) < snapshot[TOTAL]:
                    self._peak_mem[device] = snapshot[TOTAL]
                    self._peak_mem_snap[device] = dict(snapshot)

    return PropagationSkippingTracker


def _micro_batches(mem_tracker: Type[Any]) -> Type[Any]:
    class MicroBatchTracker(mem_tracker):  # type: ignore[misc, valid-type]
        """MemTracker whose per-module statistics start again at each forward of a root module."""

        def _pre_fw_hook(self, module: nn.Module, inputs: Any) -> None:
            name = self._mod_tracker.get_known_fqn(module)
            again = module in self.memory_tracking and not self._mod_tracker.is_bw
            if again and set(self._mod_tracker.parents) - {name} == {"Global"}:
                self.reset_mod_stats()
            super()._pre_fw_hook(module, inputs)

    return MicroBatchTracker


def peak_snapshot(tracker: Any) -> Mapping[str, int]:
    """The tracker's snapshot at its peak: category -> bytes, and ``Total`` (one device: the rank's)."""
    peaks: Dict[Any, Mapping[str, int]] = tracker.get_tracker_snapshot("peak")
    return next(iter(peaks.values())) if peaks else {}
