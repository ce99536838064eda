"""Same seeds, same weights: every rank seeded alike, and a digest that tells bit-identical weights apart from close
ones."""

from __future__ import annotations

import hashlib
import random
from typing import Dict

import numpy as np
import torch


def parameter_digest(weights: Dict[str, torch.Tensor]) -> str:
    """SHA-256 over every parameter and buffer of a state dict, in order: equal digests mean bit-identical weights."""
    digest = hashlib.sha256()
    for name, tensor in weights.items():
        digest.update(name.encode())
        digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % (2**32))
    torch.manual_seed(seed)
