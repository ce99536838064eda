"""User code for the performance tests (tests/e2e/test_performance.py), named by _target_ as a user's package would be:
a data set that is slow to read (on every rank, or on one), and a step that holds a known extra tensor."""

import os
import time

import torch
import torch.nn.functional as F
from torch.utils.data import Dataset

HELD_MB = 256  # the extra tensor a step of `holding` keeps alive


class SlowReads(Dataset):
    """8x8 random images whose every read sleeps `sleep_s` (on rank `only_rank` alone when given)."""

    def __init__(
        self,
        sleep_s: float,
        only_rank=None,
        num_samples: int = 256,
        image_size: int = 8,
        num_classes: int = 10,
        seed: int = 1,
    ):
        generator = torch.Generator().manual_seed(seed)
        self.images = torch.randn(num_samples, 3, image_size, image_size, generator=generator)
        self.labels = torch.randint(0, num_classes, (num_samples,), generator=generator)
        slow_here = only_rank is None or os.environ.get("RANK", "0") == str(only_rank)
        self.sleep_s = sleep_s if slow_here else 0.0

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int):
        if self.sleep_s:
            time.sleep(self.sleep_s)
        return self.images[index], self.labels[index]


_held = []


def holding(model, batch):
    """The built-in step, after the first one has allocated (and written) HELD_MB that stays alive."""
    if not _held:
        _held.append(torch.ones(HELD_MB * 2**20 // 4, dtype=torch.float32))
    inputs, labels = batch
    return F.cross_entropy(model(inputs), labels)


def plain(model, batch):
    inputs, labels = batch
    return F.cross_entropy(model(inputs), labels)
