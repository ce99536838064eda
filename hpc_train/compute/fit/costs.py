"""What one training step costs a rank, counted on the estimate's fake tensors: its FLOPs and the bytes its
collectives move, by kind and by link. The cost model (login side, ``hpc_train.launch.planning.cost_model``) turns
them into a step time.

* FLOPs: torch's FLOP counter (``torch.utils.flop_counter.FlopCounterMode``), which reads each operation's shapes
  (matrix products, convolutions, attention), so it runs on fake tensors; the backward pass and activation
  checkpointing's recomputation are counted as they run.
* Communication: every collective the step issues goes through torch's dispatcher (the c10d ops FSDP2 and DDP call,
  the functional collectives DTensor calls, a pipeline's sends and receives), where :class:`CommCounter` sees it with
  its tensors and its process group, even in the fake process group, which sends nothing. A collective is counted
  as the bytes one rank sends in the ring algorithm, for a payload of S bytes (the whole tensor: an all-gather's
  output, a reduce-scatter's input, an all-reduce's tensor) over a group of n ranks: all-reduce 2 (n - 1) / n S,
  all-gather, reduce-scatter and all-to-all (n - 1) / n S, broadcast, send and receive S. Counted ``intra`` when the
  group's ranks are on one node (ranks r // GPUs per node), else ``inter``: a ring across nodes runs at the
  inter-node link's speed.
"""

from __future__ import annotations

import contextlib
import functools
from dataclasses import dataclass, field
from typing import Any, Dict, Iterator, List, Optional, Tuple

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_map_only
from torch.utils.flop_counter import FlopCounterMode

# The collectives by kind: the dispatcher's op names (c10d's and the functional collectives') -> the kind.
KINDS = {
    "allreduce_": "all_reduce",
    "allreduce_coalesced_": "all_reduce",
    "all_reduce": "all_reduce",
    "all_reduce_coalesced": "all_reduce",
    "allgather_": "all_gather",
    "_allgather_base_": "all_gather",
    "allgather_into_tensor_coalesced_": "all_gather",
    "allgather_coalesced_": "all_gather",
    "all_gather_into_tensor": "all_gather",
    "all_gather_into_tensor_coalesced": "all_gather",
    "all_gather_into_tensor_out": "all_gather",
    "reduce_scatter_": "reduce_scatter",
    "_reduce_scatter_base_": "reduce_scatter",
    "reduce_scatter_tensor_coalesced_": "reduce_scatter",
    "reduce_scatter_tensor": "reduce_scatter",
    "reduce_scatter_tensor_coalesced": "reduce_scatter",
    "alltoall_": "all_to_all",
    "alltoall_base_": "all_to_all",
    "all_to_all_single": "all_to_all",
    "broadcast_": "broadcast",
    "broadcast": "broadcast",
    "send": "p2p",
    "recv_": "p2p",
    "recv_any_source_": "p2p",
}
NAMESPACES = ("c10d", "_c10d_functional", "c10d_functional")
RING = {"all_reduce": lambda n: 2 * (n - 1) / n, "broadcast": lambda n: 1.0, "p2p": lambda n: 1.0}  # else (n - 1) / n
_GATHERS_FROM_INPUT = ("all_gather_into_tensor", "all_gather_into_tensor_coalesced")  # the output is n x the input


@dataclass
class StepCosts:
    """One rank's step: its FLOPs, the bytes it sends by collective kind and link (``intra``: inside a node,
    ``inter``: across nodes), and how many collectives it issues on each link (each pays the link's latency)."""

    flops: int = 0
    comm: Dict[str, Dict[str, int]] = field(default_factory=dict)
    messages: Dict[str, int] = field(default_factory=dict)

    def add(self, kind: str, link: str, count: float) -> None:
        by_link = self.comm.setdefault(kind, {})
        by_link[link] = by_link.get(link, 0) + int(count)
        self.messages[link] = self.messages.get(link, 0) + 1

    def as_dict(self) -> Dict[str, Any]:
        comm = {kind: dict(links) for kind, links in self.comm.items()}
        return {"flops": self.flops, "comm": comm, "messages": dict(self.messages)}


class CommCounter(TorchDispatchMode):
    """Counts every collective that passes through the dispatcher into `costs` (see the module's docstring)."""

    def __init__(self, costs: StepCosts, gpus_per_node: int) -> None:
        super().__init__()
        self.costs, self.gpus_per_node = costs, max(1, gpus_per_node)

    def __torch_dispatch__(self, func: Any, types: Any, args: Tuple[Any, ...] = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        name = func._schema.name.split("::")[-1] if hasattr(func, "_schema") else ""
        if func.namespace in NAMESPACES and name in KINDS:
            self._count(KINDS[name], name, args)
        return out

    def _count(self, kind: str, name: str, args: Tuple[Any, ...]) -> None:
        ranks = _group_ranks(args)
        size = len(ranks) if ranks else _group_size(args)
        payload = max((_bytes(arg) for arg in args), default=0)
        if name in _GATHERS_FROM_INPUT:
            payload *= size
        share = RING.get(kind, lambda n: (n - 1) / n)(max(size, 1))
        nodes = {rank // self.gpus_per_node for rank in ranks}
        self.costs.add(kind, "inter" if len(nodes) > 1 else "intra", payload * share)


@contextlib.contextmanager
def counting(costs: Optional[StepCosts], gpus_per_node: int) -> Iterator[None]:
    """Count the FLOPs and collectives of what runs inside into `costs` (nothing when it is None)."""
    if costs is None:
        yield
        return
    flops = LocalFlopCounter(display=False)
    with flops, CommCounter(costs, gpus_per_node):
        yield
    costs.flops += int(flops.get_total_flops())


class LocalFlopCounter(FlopCounterMode):
    """torch's FLOP counter reading a DTensor's local shard: the counter's mode runs before DTensor's dispatch and
    would count a tensor-parallel product at its global shape, the whole of the tp group's work."""

    def _count_flops(self, func_packet: Any, out: Any, args: Any, kwargs: Any) -> Any:
        local = functools.partial(tree_map_only, DTensor, lambda tensor: tensor.to_local())
        super()._count_flops(func_packet, local(out), local(args), local(kwargs))
        return out


def _bytes(arg: Any) -> int:
    """The bytes of a tensor argument, or of a list of them (lists of lists: all-gather's outputs)."""
    if isinstance(arg, torch.Tensor):
        return arg.numel() * arg.element_size()
    if isinstance(arg, (list, tuple)):
        return sum(_bytes(item) for item in arg)
    return 0


def _group(args: Tuple[Any, ...]) -> Any:
    """The process group among a collective's arguments: a ProcessGroup, boxed (c10d's ops), or the name of one
    (the functional collectives, their last str argument)."""
    for arg in args:
        if isinstance(arg, dist.ProcessGroup):
            return arg
        if isinstance(arg, torch.ScriptObject):
            with contextlib.suppress(Exception):  # a boxed reduce op is a ScriptObject too
                return dist.ProcessGroup.unbox(arg)
    names = [arg for arg in args if isinstance(arg, str)]
    if names:
        with contextlib.suppress(Exception):  # a name torch does not know
            return dist.distributed_c10d._resolve_process_group(names[-1])
    return None


def _group_ranks(args: Tuple[Any, ...]) -> List[int]:
    group = _group(args)
    if group is None:
        return []
    with contextlib.suppress(Exception):  # a group torch does not know by its ranks
        return list(dist.get_process_group_ranks(group))
    return []


def _group_size(args: Tuple[Any, ...]) -> int:
    """The group's size where its ranks are not known: the functional collectives' group_size argument."""
    sizes = [arg for arg in args if isinstance(arg, int) and not isinstance(arg, bool) and arg > 0]
    return sizes[-1] if sizes else 1
