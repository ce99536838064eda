"""The shipped example datasets, as plain factories a config names with ``_target_``.

Each returns a map-style dataset of ``(image, label)`` pairs; ``conf/data/*.yaml`` points its
``train`` and ``val`` nodes at them exactly as a user's config points at their own dataset.
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F
from torch.utils.data import Dataset, TensorDataset

DIGITS_SPLIT_SEED = 12345  # the train/val split is fixed, whatever the run's seed


def digits(split: str, image_size: int = 32, val_fraction: float = 0.2) -> TensorDataset:
    """scikit-learn's bundled 8x8 handwritten digits, upscaled to `image_size`, 3 channels, in [-1, 1]."""
    from sklearn.datasets import load_digits  # imported here: only the digits data needs it

    if split not in ("train", "val"):
        raise ValueError(f"split must be 'train' or 'val', got {split!r}")
    bunch = load_digits()
    images = torch.tensor(bunch.images, dtype=torch.float32).unsqueeze(1) / 16.0  # (N, 1, 8, 8) in [0, 1]
    labels = torch.tensor(bunch.target, dtype=torch.long)
    if image_size != images.shape[-1]:
        images = F.interpolate(images, size=(image_size, image_size), mode="bilinear", align_corners=False)
    images = ((images - 0.5) / 0.5).expand(-1, 3, -1, -1).contiguous()
    order = torch.randperm(len(labels), generator=torch.Generator().manual_seed(DIGITS_SPLIT_SEED))
    n_val = int(round(len(labels) * float(val_fraction)))
    chosen = order[:n_val] if split == "val" else order[n_val:]
    return TensorDataset(images[chosen], labels[chosen])


def synthetic(num_samples: int, image_size: int = 32, num_classes: int = 10, seed: int = 1) -> TensorDataset:
    """Deterministic random images (3 x image_size x image_size) and labels."""
    gen = torch.Generator().manual_seed(seed)
    images = torch.randn(num_samples, 3, image_size, image_size, generator=gen)
    labels = torch.randint(0, num_classes, (num_samples,), generator=gen)
    return TensorDataset(images, labels)


def image_folder(root: str, split: str, image_size: int = 224, augment: bool = False) -> Dataset:
    """torchvision's ImageFolder over ``root/split/<class>/*``, ImageNet-style transforms."""
    from torchvision import datasets, transforms  # torchvision costs ~2 s to import: only image folders need it

    normalize = transforms.Normalize(mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225])
    if augment:
        steps = [transforms.RandomResizedCrop(image_size), transforms.RandomHorizontalFlip()]
    else:
        steps = [transforms.Resize(int(image_size * 256 / 224)), transforms.CenterCrop(image_size)]
    return datasets.ImageFolder(
        str(Path(root).expanduser() / split), transform=transforms.Compose([*steps, transforms.ToTensor(), normalize])
    )
