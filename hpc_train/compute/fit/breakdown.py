"""One rank's estimated peak memory, broken down by what holds it, from torch's memory tracker's snapshot at the peak.

The tracker (``torch.distributed._tools``: ``MemTracker``, or ``FSDPMemTracker`` for a model FSDP2 shards) files
every live tensor's storage under a category; :data:`CATEGORIES` maps its categories onto the fields here, so the
fields of a :class:`RankEstimate` add up to its peak.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Dict, List, Mapping, Optional

from hpc_train.sizes import size_text

# The tracker's category names (MemTracker's _MemRefType, FSDPMemTracker's _FSDPRefType) -> the field holding them.
CATEGORIES = {
    "Parameter": "parameters",
    "Buffer": "parameters",
    "Sharded Param": "parameters",
    "Gradient": "gradients",
    "Sharded Grad": "gradients",
    "Optstate": "optimizer_state",
    "OptState": "optimizer_state",
    "Activation": "activations",
    "Temp": "temporaries",
    "Unsharded Param": "transient",  # FSDP2: a unit's parameters all-gathered for its forward or backward
    "Unsharded Grad": "transient",  # FSDP2: a unit's whole gradients before their reduce-scatter
    "All Gather": "transient",
    "Reduce Scatter": "transient",
    "Inputs": "inputs",
    "Other": "inputs",
}
TOTAL = "Total"


@dataclass(frozen=True)
class RankEstimate:
    """Bytes one rank holds at its peak, by what holds them (they add up to `peak`).

    ``parameters``: its parameters (its shard of them under FSDP) and buffers; ``gradients``: their gradients;
    ``optimizer_state``: the optimizer's state (AdamW: two tensors per parameter) and, at a peak inside its step,
    what the step makes while it runs; ``activations``: what the forward pass keeps for the backward pass (and
    recomputes under activation checkpointing); ``temporaries``: the backward pass's own tensors (gradients of
    activations); ``transient``: FSDP2's all-gathered parameters and unsharded gradients, with their all-gather and
    reduce-scatter buffers; ``inputs``: the batch and what the tracker could not file. ``stage``: the pipeline stage
    this rank runs (None without pipeline stages). ``flops``, ``comm`` and ``messages``: one training step's FLOPs,
    the bytes its collectives send by kind and link, and how many it issues per link
    (hpc_train.compute.fit.costs.StepCosts), which the cost model reads."""

    rank: int
    stage: Optional[int]
    coordinates: Mapping[str, int]
    parameters: int = 0
    gradients: int = 0
    optimizer_state: int = 0
    activations: int = 0
    temporaries: int = 0
    transient: int = 0
    inputs: int = 0
    peak: int = 0
    flops: int = 0
    comm: Mapping[str, Mapping[str, int]] = field(default_factory=dict)
    messages: Mapping[str, int] = field(default_factory=dict)

    def as_dict(self) -> Dict[str, Any]:
        comm = {kind: dict(links) for kind, links in self.comm.items()}
        return {**asdict(self), "coordinates": dict(self.coordinates), "comm": comm, "messages": dict(self.messages)}

    def describe(self) -> str:
        """One line: the peak, then each part that holds anything."""
        parts = [f"{name.replace('_', ' ')} {size_text(value)}" for name, value in self._parts().items() if value]
        where = f"rank {self.rank}" + (f" (stage {self.stage})" if self.stage is not None else "")
        return f"{where}: peak {size_text(self.peak)} = " + " + ".join(parts)

    def _parts(self) -> Dict[str, int]:
        names = ("parameters", "gradients", "optimizer_state", "activations", "temporaries", "transient", "inputs")
        return {name: getattr(self, name) for name in names}


def from_snapshot(
    snapshot: Mapping[str, int],
    rank: int,
    stage: Optional[int],
    coordinates: Mapping[str, int],
    costs: Any = None,
) -> RankEstimate:
    """A RankEstimate from one device's peak snapshot (category -> bytes, and ``Total``) and the step's `costs`
    (hpc_train.compute.fit.costs.StepCosts, or None)."""
    sums: Dict[str, int] = {}
    for category, value in snapshot.items():
        label = str(getattr(category, "value", category))  # the tracker's keys are str enums, or "Total"
        if label == TOTAL:
            continue
        name = CATEGORIES.get(label, "inputs")
        sums[name] = sums.get(name, 0) + int(value)
    counted = costs.as_dict() if costs is not None else {}
    return RankEstimate(rank, stage, dict(coordinates), **sums, peak=sum(sums.values()), **counted)


@dataclass(frozen=True)
class JobEstimate:
    """Every estimated rank of a job (one per pipeline stage: the ranks of a stage hold the same), the layout in
    words and how long the estimate took. ``floor``: not simulated, the least its largest rank can hold
    (:mod:`hpc_train.compute.fit.floor`), one rank's parameters, gradients and optimizer state."""

    layout: str
    ranks: List[RankEstimate] = field(default_factory=list)
    seconds: float = 0.0
    floor: bool = False

    def as_dict(self) -> Dict[str, Any]:
        """Plain data (what ``python -m hpc_train.compute.fit --json`` prints): the layout, the seconds, each rank,
        and whether it is the floor."""
        ranks = [rank.as_dict() for rank in self.ranks]
        return {"layout": self.layout, "seconds": self.seconds, "ranks": ranks, "floor": self.floor}

    @property
    def peak(self) -> int:
        """The most any rank holds: what must fit in one device."""
        return max((r.peak for r in self.ranks), default=0)

    def describe(self) -> str:
        what = "the least its largest rank holds" if self.floor else "estimated peak memory per rank"
        lines = [f"{what} ({self.layout}; {self.seconds:.1f} s to estimate):"]
        return "\n".join([*lines, *(f"  {rank.describe()}" for rank in self.ranks)])
