"""Loaders and samplers over the user's datasets (built from the config, see compute/user/building.py).

Sharding: the training set goes through ``DistributedSampler(drop_last=True)``. Its
permutation depends only on the seed and the epoch, and rank r takes every W-th element,
so at step k the union of the W per-rank batches is exactly the k-th block of B = W*b
samples of that permutation: a single process with batch B sees the same samples per step.
Evaluation shards without padding, so the all-reduced accuracy counts each sample once.

Streamed data (a ``torch.utils.data.IterableDataset``) is not sharded by a sampler: the
dataset shards itself. :func:`data_shard` tells it which share is its own, (rank, size) of the
data-parallel group, set before the datasets are built; inside loader workers it combines with
``torch.utils.data.get_worker_info()``. A stream with ``state_dict()``/``load_state_dict()`` is
read through torchdata's ``StatefulDataLoader`` (when torchdata is installed), whose state is
checkpointed per rank, so a resumed run reads exactly the batches it would have read.
"""

from __future__ import annotations

import contextlib
import warnings
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Mapping, Optional, Sized, Tuple

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset, DistributedSampler, IterableDataset, Sampler

_SHARD: Optional[Tuple[int, int]] = None  # (rank, size) of this process's data-parallel group, set by the trainer


@dataclass(frozen=True)
class DataSettings:
    """The ``data`` section: the datasets' ``_target_`` nodes (built by compute/user/building.py) and what the
    loaders take. The shipped options' own keys (root, image_size, ...) reach the datasets through those nodes."""

    train: Mapping[str, Any]
    val: Optional[Mapping[str, Any]]  # None: no evaluation
    collate_fn: Optional[Mapping[str, Any]]  # None: PyTorch's default collate
    num_workers: int
    pin_memory: bool


def data_shard() -> Tuple[int, int]:
    """(rank, size) of the data-parallel group this process reads for: the share of a stream that is its own.

    In a running job it is set before ``data.train`` is built (pipeline stages of one replica
    share a shard); elsewhere it is torch.distributed's rank and world size, or (0, 1).
    """
    if _SHARD is not None:
        return _SHARD
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def set_data_shard(rank: int, size: int) -> None:
    global _SHARD
    _SHARD = (int(rank), int(size))


@contextlib.contextmanager
def data_shard_for(rank: int, size: int) -> Iterator[None]:
    """The shard set for the block's length and the one before it set again after: for a process that plays a rank
    for a while (the memory estimate), whose later streams must not read as that rank's."""
    global _SHARD
    before = _SHARD
    set_data_shard(rank, size)
    try:
        yield
    finally:
        _SHARD = before


def is_stream(data: Any) -> bool:
    return isinstance(data, IterableDataset)


def has_length(data: Any) -> bool:
    try:
        len(data)
    except TypeError:
        return False
    return True


def is_stateful(data: Any) -> bool:
    return callable(getattr(data, "state_dict", None)) and callable(getattr(data, "load_state_dict", None))


def stateful_loader_class() -> Optional[type]:
    """torchdata's StatefulDataLoader, or None where torchdata is not installed."""
    try:
        from torchdata.stateful_dataloader import StatefulDataLoader  # optional: torchdata
    except ImportError:
        return None
    return StatefulDataLoader


class ShardSampler(Sampler[int]):
    """Every W-th index starting at `rank`, no padding and no shuffling (evaluation)."""

    def __init__(self, data: Sized, num_replicas: int, rank: int) -> None:
        self.indices = list(range(rank, len(data), num_replicas))

    def __iter__(self) -> Iterator[int]:
        return iter(self.indices)

    def __len__(self) -> int:
        return len(self.indices)


class ResumableSampler(DistributedSampler):
    """DistributedSampler that can start its next epoch part-way, at the exact next batch.

    ``skip_batches(k, b)`` drops the first k*b indices of this rank's share of the next
    epoch: a run resumed after k steps of an epoch reads the batches it would have read.
    """

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._skip = 0

    def skip_batches(self, batches: int, batch_size: int) -> None:
        self._skip = int(batches) * int(batch_size)

    def __iter__(self) -> Iterator[int]:
        indices = list(super().__iter__())
        skip, self._skip = self._skip, 0
        return iter(indices[skip:])


def train_loader(
    data: Dataset,
    settings: DataSettings,
    per_rank_batch: int,
    num_replicas: int,
    rank: int,
    seed: int,
    collate_fn: Optional[Callable] = None,
) -> DataLoader:
    sampler = ResumableSampler(data, num_replicas=num_replicas, rank=rank, shuffle=True, seed=seed, drop_last=True)
    workers = int(settings.num_workers)
    return DataLoader(
        data,
        batch_size=per_rank_batch,
        sampler=sampler,
        drop_last=True,
        # Its own generator: starting an epoch does not draw from the global RNG, so a resumed
        # run's RNG streams (restored from the checkpoint) continue exactly.
        generator=torch.Generator().manual_seed(seed),
        num_workers=workers,
        pin_memory=bool(settings.pin_memory) and torch.cuda.is_available(),
        persistent_workers=workers > 0,
        collate_fn=collate_fn,
    )


def stream_loader(
    data: IterableDataset, settings: DataSettings, per_rank_batch: int, seed: int, collate_fn: Optional[Callable] = None
) -> DataLoader:
    """Batches of a stream the dataset shards itself; stateful streams through torchdata's StatefulDataLoader."""
    workers = int(settings.num_workers)
    cls = (stateful_loader_class() if is_stateful(data) else None) or DataLoader
    warnings.filterwarnings("ignore", message=".*set_vital.*")  # torchdata 0.11 on torch >= 2.12, harmless
    return cls(
        data,
        batch_size=per_rank_batch,
        drop_last=True,
        generator=torch.Generator().manual_seed(seed),
        num_workers=workers,
        pin_memory=bool(settings.pin_memory) and torch.cuda.is_available(),
        collate_fn=collate_fn,
    )


def eval_loader(
    data: Dataset,
    settings: DataSettings,
    per_rank_batch: int,
    num_replicas: int,
    rank: int,
    collate_fn: Optional[Callable] = None,
) -> DataLoader:
    return DataLoader(
        data,
        batch_size=per_rank_batch,
        sampler=None if is_stream(data) else ShardSampler(data, num_replicas, rank),
        num_workers=int(settings.num_workers),
        pin_memory=bool(settings.pin_memory) and torch.cuda.is_available(),
        collate_fn=collate_fn,
    )
