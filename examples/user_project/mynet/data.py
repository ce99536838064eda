"""Blobs: Gaussian clusters in `dim` dimensions, one per class, generated from a seed."""

import torch
from torch.utils.data import Dataset


class Blobs(Dataset):
    def __init__(self, n: int, dim: int = 8, num_classes: int = 4, seed: int = 0, spread: float = 1.0) -> None:
        gen = torch.Generator().manual_seed(seed)
        centres = torch.randn(num_classes, dim, generator=torch.Generator().manual_seed(1234)) * 3.0
        self.labels = torch.randint(0, num_classes, (n,), generator=gen)
        self.points = centres[self.labels] + spread * torch.randn(n, dim, generator=gen)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int):
        return self.points[index], self.labels[index]


class Regression(Dataset):
    """Noisy linear targets with `outputs` dimensions: float targets, so no accuracy is reported."""

    def __init__(self, n: int, dim: int = 8, outputs: int = 2, seed: int = 0) -> None:
        gen = torch.Generator().manual_seed(seed)
        weights = torch.randn(dim, outputs, generator=torch.Generator().manual_seed(4321))
        self.inputs = torch.randn(n, dim, generator=gen)
        self.targets = self.inputs @ weights + 0.1 * torch.randn(n, outputs, generator=gen)

    def __len__(self) -> int:
        return len(self.targets)

    def __getitem__(self, index: int):
        return self.inputs[index], self.targets[index]
