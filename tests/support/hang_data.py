"""A dataset whose __getitem__ hangs on rank 1 (the hang tests' data.train._target_)."""

import os
import time

import torch
from torch.utils.data import Dataset


class HangsOnRank1(Dataset):
    """8x8 random images; on rank 1, the (hang_at)-th item read by a process sleeps for an hour (a dead file system)."""

    def __init__(
        self, num_samples: int = 512, image_size: int = 8, num_classes: int = 10, seed: int = 1, hang_at: int = 65
    ) -> None:
        generator = torch.Generator().manual_seed(seed)
        self.images = torch.randn(num_samples, 3, image_size, image_size, generator=generator)
        self.labels = torch.randint(0, num_classes, (num_samples,), generator=generator)
        self.hang_at, self.reads = hang_at, 0

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int):
        self.reads += 1
        if os.environ.get("RANK") == "1" and self.reads == self.hang_at:
            time.sleep(3600)
        return self.images[index], self.labels[index]
