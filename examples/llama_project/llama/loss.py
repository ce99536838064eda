"""Next-token cross-entropy for trainer.loss: the model's (B, T, V) logits against (B, T) target ids.

torch.nn.CrossEntropyLoss wants the classes in dimension 1, so the positions are flattened into
the batch first: every position of every sequence is one classification.
"""

import torch
import torch.nn.functional as F


def next_token_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy over all B * T positions."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
