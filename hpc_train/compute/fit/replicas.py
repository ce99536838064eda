"""``strategy=ddp`` in the estimate: the plain model, with the gradient buckets DistributedDataParallel allocates.

torch's DistributedDataParallel does not run on fake tensors in the fake process group (its constructor reads the
parameters' values to check them across ranks; its reducer reads the bucket order it broadcasts after the first
step). What a rank holds under DDP is what it holds alone, plus its reducer's gradient buckets
(``torch.nn.parallel.DistributedDataParallel``, torch's ``c10d/reducer.cpp``), which :class:`SimulatedDDP` holds and
fills as the reducer does:

* DDP's constructor cuts the trainable parameters into buckets (``dist._compute_bucket_assignment_by_size``, torch's
  own function here: the first bucket 1 MiB, the others ``bucket_cap_mb``, 25 MiB by default, one dtype a bucket)
  and gives each bucket one flat tensor the size of its parameters, in their dtype, for the life of the model:
  every gradient is held a second time. They are counted as gradients.
* hpc_train's ddp strategy passes neither ``bucket_cap_mb`` nor ``gradient_as_bucket_view`` (torch's defaults:
  25 MiB, False): each parameter's ``.grad`` is a tensor of its own. In the backward pass, as a gradient is ready it
  is copied into its bucket; a full bucket is all-reduced in place (in the fake process group: nothing is sent, but
  the collective is issued) and averaged; after it, each bucket is copied back into its gradients. In-place copies
  allocate nothing: the buckets and the gradients are the whole of DDP's own memory.
* Under ``no_sync`` (the micro-batches of gradient accumulation before the last) the gradients accumulate in
  ``.grad`` and the buckets wait; under autocast the parameters, their gradients and the buckets stay fp32.

Not simulated: the re-bucketing after the first step (the reducer's buckets laid out again in the order the
gradients became ready: the same total), a gloo or NCCL all-reduce's own scratch buffers, and ``static_graph``.
"""

from __future__ import annotations

import contextlib
from typing import Iterator, List

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel

from hpc_train.compute.parallel.base import Strategy
from hpc_train.compute.parallel.ddp import DDPStrategy

BUCKET_CAP_MB = 25  # DistributedDataParallel's default bucket_cap_mb, which hpc_train's ddp strategy keeps


def simulated(strategy: Strategy) -> bool:
    """Whether the estimate wraps the model itself for `strategy` (ddp in a world of several ranks)."""
    return isinstance(strategy, DDPStrategy) and strategy.ranks.is_distributed


class _Bucket:
    """One of the reducer's buckets: a flat tensor over some parameters' gradients, all-reduced once all are in."""

    def __init__(self, params: List[nn.Parameter]) -> None:
        self.params = params
        self.flat = torch.empty(sum(p.numel() for p in params), dtype=params[0].dtype, device=params[0].device)
        self.ready = 0

    def add(self, param: nn.Parameter) -> None:
        """The reducer's autograd hook: `param`'s gradient into its place; the bucket reduced when it is full."""
        start = self._offset(param)
        self.flat[start : start + param.numel()].copy_(param.grad.reshape(-1))
        self.ready += 1
        if self.ready == len(self.params):
            self.ready = 0
            dist.all_reduce(self.flat)
            self.flat.div_(dist.get_world_size())
            for other in self.params:
                at = self._offset(other)
                other.grad.copy_(self.flat[at : at + other.numel()].view_as(other.grad))

    def _offset(self, param: nn.Parameter) -> int:
        offset = 0
        for other in self.params:
            if other is param:
                return offset
            offset += other.numel()
        raise AssertionError("hpc_train bug: a parameter outside its bucket")


class SimulatedDDP(DistributedDataParallel):
    """`module` as the ddp strategy hands it on (an instance of DistributedDataParallel, whose ``module``,
    ``no_sync`` and ``find_unused_parameters`` the strategy reads), with the reducer's buckets and hooks of its own
    instead of DDP's constructor."""

    def __init__(self, module: nn.Module, find_unused_parameters: bool) -> None:
        nn.Module.__init__(self)
        self.module = module
        self.find_unused_parameters = find_unused_parameters
        self.require_backward_grad_sync = True
        params = [p for p in module.parameters() if p.requires_grad]
        limits = [dist._DEFAULT_FIRST_BUCKET_BYTES, BUCKET_CAP_MB * 2**20]
        indices, _ = dist._compute_bucket_assignment_by_size(params, limits, [False] * len(params))
        self.buckets = [_Bucket([params[i] for i in bucket]) for bucket in indices]
        for bucket in self.buckets:
            for param in bucket.params:
                param.register_post_accumulate_grad_hook(self._hook(bucket))

    def _hook(self, bucket: _Bucket):  # type: ignore[no-untyped-def]
        def ready(param: nn.Parameter) -> None:
            if self.require_backward_grad_sync:
                bucket.add(param)

        return ready

    def forward(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        return self.module(*args, **kwargs)

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        synced, self.require_backward_grad_sync = self.require_backward_grad_sync, False
        try:
            yield
        finally:
            self.require_backward_grad_sync = synced

    @property
    def gradient_buckets(self) -> List[torch.Tensor]:
        """The buckets' flat tensors (held beside the parameters' own gradients)."""
        return [bucket.flat for bucket in self.buckets]


def wrap(strategy: Strategy, model: nn.Module) -> SimulatedDDP:
    """`model` as `strategy` (ddp) wraps it, simulated: placed on the rank's device, its buckets made."""
    return SimulatedDDP(model.to(strategy.input_device), bool(strategy.settings.find_unused_parameters))
