"""Model zoo: torchvision ResNets (random init, nothing downloaded) and a tiny MLP for exact tests."""

from __future__ import annotations

import torch.nn as nn
import torchvision.models as tvm

RESNETS = {
    "resnet18": tvm.resnet18,
    "resnet34": tvm.resnet34,
    "resnet50": tvm.resnet50,
    "resnet101": tvm.resnet101,
    "resnet152": tvm.resnet152,
}


def toy_mlp(in_features: int, hidden: int, num_classes: int) -> nn.Sequential:
    """Two linear layers, no batch norm: every strategy must reproduce it to rounding error."""
    return nn.Sequential(nn.Flatten(), nn.Linear(in_features, hidden), nn.ReLU(), nn.Linear(hidden, num_classes))


def build_model(cfg, num_classes: int, image_size: int) -> nn.Module:
    if cfg.name in RESNETS:
        return RESNETS[cfg.name](weights=None, num_classes=num_classes)
    if cfg.name == "toy_mlp":
        return toy_mlp(3 * image_size * image_size, int(cfg.hidden), num_classes)
    raise ValueError(f"unknown model {cfg.name!r}")
