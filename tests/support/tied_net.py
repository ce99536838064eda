"""A model with tied weights (one parameter in two layers), as language models tie their embedding
and output layers: what a staged strategy must not cut apart."""

import torch
import torch.nn as nn


class TiedNet(nn.Module):
    def __init__(self, image_size: int, hidden: int, num_classes: int) -> None:  # model=toy_mlp's arguments
        super().__init__()
        width = hidden
        self.inp = nn.Linear(3 * image_size * image_size, width)
        self.mid = nn.Linear(width, width)
        self.out = nn.Linear(width, width)
        self.out.weight = self.mid.weight  # tied
        self.head = nn.Linear(width, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.inp(x.flatten(1)))
        h = torch.tanh(self.mid(h))
        return self.head(torch.tanh(self.out(h)))
