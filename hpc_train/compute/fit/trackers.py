"""torch's memory trackers (``torch.distributed._tools``) as the estimate uses them: the one that fits the model, its
peak snapshot per category.

``FSDPMemTracker`` files FSDP2's all-gathered parameters and reduce-scatter buffers apart; it takes one forward per
unit and step. ``MemTracker`` takes the rest: a pipeline's micro-batches and accumulated ones run the model several
times a step, which it refuses as a new iteration unless its per-module statistics (which the estimate does not read)
are cleared at each root forward: :func:`tracker_for` does that. Its global peak, the estimate's figure, is kept.
"""

from __future__ import annotations

from typing import Any, Dict, Mapping, Type

import torch
import torch.nn as nn

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
    made before it, tracked too."""
    mem_tracker, fsdp_tracker = _classes()
    from torch.distributed.fsdp import FSDPModule  # ~0.6 s: only the estimate pays it here

    if once and isinstance(model, FSDPModule):
        tracker = fsdp_tracker(model, optimizer)
        tracker.track_external(batch)
        return tracker
    tracker = _micro_batches(mem_tracker)()
    tracker.track_external(model, optimizer, batch)
    return tracker


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
