"""Datasets and loaders: real bundled digits, synthetic images, or an ImageFolder on disk.

Sharding: the training set goes through ``DistributedSampler(drop_last=True)``. Its
permutation depends only on the seed and the epoch, and rank r takes every W-th element,
so at step k the union of the W per-rank batches is exactly the k-th block of B = W*b
samples of that permutation: a single process with batch B sees the same samples per step.
Evaluation shards without padding, so the all-reduced accuracy counts each sample once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator, Sized

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset, DistributedSampler, Sampler, TensorDataset

DIGITS_SPLIT_SEED = 12345  # the train/val split is fixed, whatever the run's seed


@dataclass
class Datasets:
    train: Dataset
    val: Dataset
    num_classes: int
    image_size: int


def _digits(cfg) -> Datasets:
    from sklearn.datasets import load_digits  # imported here: only the digits data needs it

    bunch = load_digits()
    images = torch.tensor(bunch.images, dtype=torch.float32).unsqueeze(1) / 16.0  # (N, 1, 8, 8) in [0, 1]
    labels = torch.tensor(bunch.target, dtype=torch.long)
    size = int(cfg.image_size)
    if size != images.shape[-1]:
        images = F.interpolate(images, size=(size, size), mode="bilinear", align_corners=False)
    images = ((images - 0.5) / 0.5).expand(-1, 3, -1, -1).contiguous()
    order = torch.randperm(len(labels), generator=torch.Generator().manual_seed(DIGITS_SPLIT_SEED))
    n_val = int(round(len(labels) * float(cfg.val_fraction)))
    val_idx, train_idx = order[:n_val], order[n_val:]
    return Datasets(
        train=TensorDataset(images[train_idx], labels[train_idx]),
        val=TensorDataset(images[val_idx], labels[val_idx]),
        num_classes=10,
        image_size=size,
    )


def _synthetic_split(n: int, size: int, classes: int, seed: int) -> TensorDataset:
    gen = torch.Generator().manual_seed(seed)
    images = torch.randn(n, 3, size, size, generator=gen)
    labels = torch.randint(0, classes, (n,), generator=gen)
    return TensorDataset(images, labels)


def _synthetic(cfg) -> Datasets:
    size, classes = int(cfg.image_size), int(cfg.num_classes)
    return Datasets(
        train=_synthetic_split(int(cfg.num_samples), size, classes, seed=1),
        val=_synthetic_split(int(cfg.val_samples), size, classes, seed=2),
        num_classes=classes,
        image_size=size,
    )


def _imagefolder(cfg) -> Datasets:
    from pathlib import Path

    from torchvision import datasets, transforms

    size = int(cfg.image_size)
    normalize = transforms.Normalize(mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225])
    train_tf = transforms.Compose([transforms.RandomResizedCrop(size), transforms.RandomHorizontalFlip(), transforms.ToTensor(), normalize])
    val_tf = transforms.Compose([transforms.Resize(int(size * 256 / 224)), transforms.CenterCrop(size), transforms.ToTensor(), normalize])
    root = Path(str(cfg.root)).expanduser()
    train = datasets.ImageFolder(str(root / cfg.train_dir), transform=train_tf)
    val = datasets.ImageFolder(str(root / cfg.val_dir), transform=val_tf)
    return Datasets(train=train, val=val, num_classes=len(train.classes), image_size=size)


BUILDERS = {"digits": _digits, "synthetic": _synthetic, "imagefolder": _imagefolder}


def build_datasets(cfg) -> Datasets:
    return BUILDERS[cfg.name](cfg)


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


def train_loader(data: Dataset, cfg, per_rank_batch: int, num_replicas: int, rank: int, seed: int) -> DataLoader:
    sampler = ResumableSampler(data, num_replicas=num_replicas, rank=rank, shuffle=True, seed=seed, drop_last=True)
    workers = int(cfg.num_workers)
    return DataLoader(
        data,
        batch_size=per_rank_batch,
        sampler=sampler,
        drop_last=True,
        # Its own generator: starting an epoch does not draw from the global RNG, so a resumed
        # run's RNG streams (restored from the checkpoint) continue exactly.
        generator=torch.Generator().manual_seed(seed),
        num_workers=workers,
        pin_memory=bool(cfg.pin_memory) and torch.cuda.is_available(),
        persistent_workers=workers > 0,
    )


def eval_loader(data: Dataset, cfg, per_rank_batch: int, num_replicas: int, rank: int) -> DataLoader:
    return DataLoader(
        data,
        batch_size=per_rank_batch,
        sampler=ShardSampler(data, num_replicas, rank),
        num_workers=int(cfg.num_workers),
        pin_memory=bool(cfg.pin_memory) and torch.cuda.is_available(),
    )
