"""A herder's log, written by the project itself, cut into windows of character ids for next-token training.

make_log(n_chars, seed) writes lines such as "day 41: pepa the llama walked 7 km to the north pasture."
from a seed (no download). CharWindows is a map-style dataset of non-overlapping windows: the item
is (ids, the same ids shifted by one character), i.e. (input, target) pairs that hpc_train's built-in
step takes, with targets of the model's (B, T, vocab) logits at every position.
"""

import random
from typing import Tuple

import torch
from torch.utils.data import Dataset

CHARS = "\n :.,0123456789abcdefghijklmnopqrstuvwxyz"
VOCAB_SIZE = len(CHARS)  # 41
_ID = {c: i for i, c in enumerate(CHARS)}

_NAMES = ["pepa", "tito", "luna", "coco", "rafa"]
_ACTIONS = [
    "walked {n} km to the {side} pasture",
    "ate {n} bundles of hay",
    "carried {n} bags down the hill",
    "slept for {n} hours by the {side} fence",
]
_SIDES = ["north", "south", "east", "west"]


def _entry(rng: random.Random, day: int) -> str:
    action = rng.choice(_ACTIONS).format(n=rng.randrange(1, 20), side=rng.choice(_SIDES))
    return f"day {day}: {rng.choice(_NAMES)} the llama {action}.\n"


def make_log(n_chars: int, seed: int) -> str:
    """Exactly n_chars characters of log lines (days counting up), all from CHARS; the same for the same seed."""
    rng, lines, size, day = random.Random(seed), [], 0, 1
    while size < n_chars:
        lines.append(_entry(rng, day))
        size += len(lines[-1])
        day += 1
    return "".join(lines)[:n_chars]


def encode(text: str) -> torch.Tensor:
    return torch.tensor([_ID[c] for c in text], dtype=torch.long)


def decode(ids: torch.Tensor) -> str:
    return "".join(CHARS[i] for i in ids.tolist())


class CharWindows(Dataset):
    """num_windows windows of seq_len characters: x, and y = x shifted by one character.

    vocab_size is the model's vocabulary, checked to hold every character (it may be padded beyond them).
    """

    def __init__(
        self, seq_len: int, num_windows: int, split: str = "train", seed: int = 0, vocab_size: int = VOCAB_SIZE
    ) -> None:
        assert split in ("train", "val"), f"split must be 'train' or 'val', not {split!r}"
        assert vocab_size >= VOCAB_SIZE, f"vocab_size is {vocab_size}, but the log has {VOCAB_SIZE} characters"
        self.seq_len = seq_len
        self.ids = encode(
            make_log(num_windows * seq_len + 1, seed=2 * seed + (split == "val"))
        )  # splits never share text

    def __len__(self) -> int:
        return (len(self.ids) - 1) // self.seq_len

    def __getitem__(self, i: int) -> Tuple[torch.Tensor, torch.Tensor]:
        chunk = self.ids[i * self.seq_len : (i + 1) * self.seq_len + 1]
        return chunk[:-1], chunk[1:]
