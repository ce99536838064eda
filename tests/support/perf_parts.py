"""User code for the performance tests (tests/e2e/test_performance.py), named by _target_ as a user's package would be:
a data set that is slow to read (on every rank, or on one), or that holds a known extra tensor."""

import os
import time

import torch
from torch.utils.data import Dataset

HELD_MB = 256  # the extra tensor a data set built with hold_mb=HELD_MB keeps alive


class SlowReads(Dataset):
    """8x8 random images whose every read sleeps `sleep_s` (on rank `only_rank` alone when given); with `hold_mb`,
    the data set also holds that many MB of written memory from its construction to the end of the run."""

    def __init__(
        self,
        sleep_s: float,
        only_rank=None,
        num_samples: int = 256,
        image_size: int = 8,
        num_classes: int = 10,
        seed: int = 1,
        hold_mb: int = 0,
    ):
        generator = torch.Generator().manual_seed(seed)
        self.images = torch.randn(num_samples, 3, image_size, image_size, generator=generator)
        self.labels = torch.randint(0, num_classes, (num_samples,), generator=generator)
        slow_here = only_rank is None or os.environ.get("RANK", "0") == str(only_rank)
        self.sleep_s = sleep_s if slow_here else 0.0
        self.held = torch.ones(hold_mb * 2**20 // 4, dtype=torch.float32)  # every page written: resident

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int):
        if self.sleep_s:
            time.sleep(self.sleep_s)
        return self.images[index], self.labels[index]
