"""Loaders and samplers over any map-style dataset (the datasets come from the config, see user_code).

Sharding: the training set goes through ``DistributedSampler(drop_last=True)``. Its
permutation depends only on the seed and the epoch, and rank r takes every W-th element,
so at step k the union of the W per-rank batches is exactly the k-th block of B = W*b
samples of that permutation: a single process with batch B sees the same samples per step.
Evaluation shards without padding, so the all-reduced accuracy counts each sample once.
"""

from __future__ import annotations

from typing import Callable, Iterator, Optional, Sized

import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler, Sampler


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
    cfg,
    per_rank_batch: int,
    num_replicas: int,
    rank: int,
    seed: int,
    collate_fn: Optional[Callable] = None,
) -> DataLoader:
    sampler = ResumableSampler(data, num_replicas=num_replicas, rank=rank, shuffle=True, seed=seed, drop_last=True)
    workers = int(cfg.get("num_workers", 0))
    return DataLoader(
        data,
        batch_size=per_rank_batch,
        sampler=sampler,
        drop_last=True,
        # Its own generator: starting an epoch does not draw from the global RNG, so a resumed
        # run's RNG streams (restored from the checkpoint) continue exactly.
        generator=torch.Generator().manual_seed(seed),
        num_workers=workers,
        pin_memory=bool(cfg.get("pin_memory", False)) and torch.cuda.is_available(),
        persistent_workers=workers > 0,
        collate_fn=collate_fn,
    )


def eval_loader(
    data: Dataset, cfg, per_rank_batch: int, num_replicas: int, rank: int, collate_fn: Optional[Callable] = None
) -> DataLoader:
    return DataLoader(
        data,
        batch_size=per_rank_batch,
        sampler=ShardSampler(data, num_replicas, rank),
        num_workers=int(cfg.get("num_workers", 0)),
        pin_memory=bool(cfg.get("pin_memory", False)) and torch.cuda.is_available(),
        collate_fn=collate_fn,
    )
