"""Byte-level blocks of generated arithmetic ("12 + 7 = 19"), as Hugging Face models take them.

Each item is a dict {"input_ids", "labels"} with labels equal to input_ids: the model shifts
the labels itself. PyTorch's default collate stacks the dicts into a dict of [batch, block]
tensors, which hpc_train.steps.model_loss passes as model(**batch).
"""

import random
from typing import Dict

import torch
from torch.utils.data import Dataset


def _line(rng: random.Random) -> str:
    a, b = rng.randrange(100), rng.randrange(100)
    op = rng.choice("+-*")
    result = a + b if op == "+" else a - b if op == "-" else a * b
    return f"{a} {op} {b} = {result}\n"


def make_text(n_chars: int, seed: int) -> str:
    """Exactly n_chars characters of arithmetic lines (ASCII); the same for the same seed."""
    rng, parts, size = random.Random(seed), [], 0
    while size < n_chars:
        parts.append(_line(rng))
        size += len(parts[-1])
    return "".join(parts)[:n_chars]


class TextBlocks(Dataset):
    """num_blocks consecutive, non-overlapping blocks of block_size bytes (token ids 0-255)."""

    def __init__(self, block_size: int = 32, split: str = "train", num_blocks: int = 2048, seed: int = 0) -> None:
        assert split in ("train", "val"), f"split must be 'train' or 'val', not {split!r}"
        text = make_text(num_blocks * block_size, seed=2 * seed + (split == "val"))  # train and val never share text
        self.blocks = torch.tensor(list(text.encode("ascii")), dtype=torch.long).view(num_blocks, block_size)

    def __len__(self) -> int:
        return len(self.blocks)

    def __getitem__(self, i: int) -> Dict[str, torch.Tensor]:
        ids = self.blocks[i]
        return {"input_ids": ids, "labels": ids.clone()}
