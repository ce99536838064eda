"""TinyNet: a feature extractor and a classification head, with a skip connection around the head's input."""

import torch
import torch.nn as nn


class TinyNet(nn.Module):
    def __init__(self, in_features: int, width: int = 16, num_classes: int = 4, depth: int = 2) -> None:
        super().__init__()
        layers = [nn.Linear(in_features, width), nn.Tanh()]
        for _ in range(depth - 1):
            layers += [nn.Linear(width, width), nn.Tanh()]
        self.features = nn.Sequential(*layers)
        self.mix = nn.Linear(width, width)
        self.head = nn.Linear(width, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.features(x)
        return self.head(torch.tanh(self.mix(h)) + h)
