"""The shipped example model that is not a torchvision one (the config names it with ``_target_``)."""

from __future__ import annotations

import torch.nn as nn


def toy_mlp(image_size: int, num_classes: int, hidden: int = 64, in_channels: int = 3) -> nn.Sequential:
    """Two linear layers, no batch norm: every strategy must reproduce it to rounding error."""
    in_features = in_channels * image_size * image_size
    return nn.Sequential(nn.Flatten(), nn.Linear(in_features, hidden), nn.ReLU(), nn.Linear(hidden, num_classes))
