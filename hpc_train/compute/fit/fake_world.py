"""One rank of a world of N simulated in this process: torch's fake process group (every collective returns at
once, nothing is sent), and the tensors of the step made fake (shapes, dtypes and devices, no storage).

The job's device mesh is made inside the fake world but before fake tensors are switched on (its groups are built
from real rank lists); the model, its wrapping, the optimizer and the step come after, on fake tensors. The tools
are torch's (``torch.distributed._tools``, ``torch._subclasses.fake_tensor``): a torch without one is refused
here, naming what is missing.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator, Type

import torch
import torch.distributed as dist
import torch.nn as nn
from torch._subclasses import fake_tensor
from torch._subclasses.fake_tensor import FakeTensorMode, unset_fake_temporarily
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, _redistribute
from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode

from hpc_train.compute.runtime.ranks import RankInfo
from hpc_train.compute.runtime.refusal import Refusal
from hpc_train.contracts.job_layout import JobLayout


@contextlib.contextmanager
def fake_mode() -> Iterator[Any]:
    """A FakeTensorMode that takes real tensors too (a module's constants, a buffer made before it), in which moving
    a module to the device it is on already leaves it as it is (:func:`_staying_put`)."""

    moved, meshed = nn.Module.to, DeviceMesh.__init__
    nn.Module.to = _staying_put(moved)  # type: ignore[method-assign]
    DeviceMesh.__init__ = _real_mesh(meshed)  # type: ignore[method-assign]
    try:
        with FakeTensorMode(allow_non_fake_inputs=True) as mode:
            yield mode
    finally:
        nn.Module.to, DeviceMesh.__init__ = moved, meshed  # type: ignore[method-assign]


def _real_mesh(original: Callable[..., None]) -> Callable[..., None]:
    """``DeviceMesh.__init__`` on real tensors: FSDP2 over a tensor-parallel model joins the dp and tp meshes into a
    new mesh, whose rank table must be real (it looks this rank up in it), as the job's mesh made before was."""

    def init(mesh: Any, *args: Any, **kwargs: Any) -> None:
        with unset_fake_temporarily():
            original(mesh, *args, **kwargs)

    return init


def _staying_put(original: Callable[..., nn.Module]) -> Callable[..., nn.Module]:
    """``Module.to`` that returns the module itself when each of its tensors is on the asked device already. A
    strategy places the model with ``model.to(device)``; torch swaps a fake parameter for the moved one, which it
    refuses for a tensor with weak references (every fake tensor has one), even when nothing moves."""

    def to(module: nn.Module, *args: Any, **kwargs: Any) -> nn.Module:
        device, dtype, _, _ = torch._C._nn._parse_to(*args, **kwargs)
        tensors = [*module.parameters(), *module.buffers()]
        if dtype is None and device is not None and all(t.device == torch.device(device) for t in tensors):
            return module
        return original(module, *args, **kwargs)

    return to


def untraceable() -> tuple[Type[BaseException], ...]:
    """What fake tensors raise on an operation whose output depends on the data (torch's own exceptions)."""

    names = ("DataDependentOutputException", "DynamicOutputShapeException", "UnsupportedOperatorException")
    found = tuple(getattr(fake_tensor, name) for name in names if hasattr(fake_tensor, name))

    return (*found, GuardOnDataDependentSymNode)


def rank_info(layout: JobLayout, rank: int) -> RankInfo:
    """Rank `rank` of `layout`'s world as the project's ranks see themselves (tasks_per_node per node)."""
    tasks = int(layout.tasks_per_node)
    return RankInfo(rank, rank % tasks, int(layout.world_size), tasks, "localhost", 0, "estimate")


@contextlib.contextmanager
def fake_world(layout: JobLayout, rank: int) -> Iterator[RankInfo]:
    """This process as rank `rank` of `layout`'s world on torch's fake process group, for the block's length."""
    if dist.is_initialized():
        raise AssertionError(  # hpc_train's own invariant, not the user's input: a traceback is wanted
            "hpc_train bug: the estimate runs in a process of its own, not in a rank"
        )
    try:
        from torch.testing._internal.distributed.fake_pg import FakeStore  # torch's test tool: only the estimate
    except ImportError as error:
        raise Refusal(
            f"the memory estimate needs torch's fake process group, which torch {torch.__version__} does not have"
            f" ({error}). Fix: run the estimate with torch 2.6 or newer (the ranks may keep their own)."
        ) from None
    ranks = rank_info(layout, rank)
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=ranks.world_size)
    try:
        yield ranks
    finally:
        dist.destroy_process_group()
        _forget_meshes()


def _forget_meshes() -> None:
    """Empty torch's DTensor caches, whose entries hold the device meshes of the rank just simulated: a mesh of the
    next rank's world compares equal to one of them, and a cached result would hand it process groups that are gone."""
    try:
        # torch's helper that empties both caches (Python's and C++'s), where this torch has it
        from torch.distributed.tensor.debug import _clear_sharding_prop_cache
    except ImportError:  # an older torch: its Python cache alone
        DTensor._op_dispatcher.sharding_propagator.propagate_op_sharding.cache_clear()
    else:
        _clear_sharding_prop_cache()
    cached = getattr(_redistribute, "_gen_transform_infos", None)
    if hasattr(cached, "cache_clear"):
        cached.cache_clear()
