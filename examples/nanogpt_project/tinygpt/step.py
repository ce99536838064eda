"""The training step hpc_train calls (trainer.step): nanoGPT's model returns (logits, loss) itself."""

from typing import Tuple

import torch


def step(model: torch.nn.Module, batch: Tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """One batch of (idx, targets) -> the scalar loss to backpropagate."""
    idx, targets = batch
    _, loss = model(idx, targets)
    return loss
