"""Character-level text the project generates itself, as a map-style dataset and as a sharded stream.

make_text writes English-like lines (numbers spelled out, short sentences from small word lists)
from a seed: no download. CharDataset holds fixed windows (map-style, with a length). CharStream
yields windows of consecutive text from an IterableDataset without a length, split over the
data-parallel ranks (hpc_train.data_shard) and the loader workers, and saves how far it got
(state_dict/load_state_dict) so a resumed job continues from the next window. CharStreamNoState
is the same stream without those two methods (hpc_train then skips the consumed batches).
"""

import random
from typing import Dict, Iterator, Tuple

import torch
from torch.utils.data import Dataset, IterableDataset, get_worker_info

ALPHABET = "\n ,.abcdefghijklmnopqrstuvwxyz"
VOCAB_SIZE = len(ALPHABET)  # 30
_INDEX = {c: i for i, c in enumerate(ALPHABET)}

_ONES = (
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen"
    " seventeen eighteen nineteen"
).split()
_TENS = "_ _ twenty thirty forty fifty sixty seventy eighty ninety".split()
_WORDS = {
    "det": ["the", "a", "my", "every"],
    "adj": ["red", "small", "old", "quiet", "happy", "green"],
    "noun": ["cat", "dog", "bird", "child", "farmer", "robot"],
    "verb": ["sees", "follows", "likes", "finds", "helps"],
    "end": ["and it runs", "then it sleeps", "but nobody knows why", "and they sing"],
}


def spell(n: int) -> str:
    """0 <= n < 1000 in words: 123 -> 'one hundred and twenty three'."""
    hundreds, rest = divmod(n, 100)
    words = [_ONES[hundreds], "hundred"] if hundreds else []
    if rest or not hundreds:
        words += ["and"] if hundreds else []
        words += [_ONES[rest]] if rest < 20 else [_TENS[rest // 10]] + ([_ONES[rest % 10]] if rest % 10 else [])
    return " ".join(words)


def _line(rng: random.Random) -> str:
    if rng.random() < 0.5:
        return spell(rng.randrange(1000)) + ".\n"
    w = {k: rng.choice(v) for k, v in _WORDS.items()}
    other = f"{rng.choice(_WORDS['det'])} {rng.choice(_WORDS['noun'])}"
    return f"{w['det']} {w['adj']} {w['noun']} {w['verb']} {other}, {w['end']}.\n"


def make_text(n_chars: int, seed: int) -> str:
    """Exactly n_chars characters of generated lines, all from ALPHABET; the same for the same seed."""
    rng, parts, size = random.Random(seed), [], 0
    while size < n_chars:
        parts.append(_line(rng))
        size += len(parts[-1])
    return "".join(parts)[:n_chars]


def encode(text: str) -> torch.Tensor:
    return torch.tensor([_INDEX[c] for c in text], dtype=torch.long)


def decode(ids: torch.Tensor) -> str:
    return "".join(ALPHABET[i] for i in ids.tolist())


def _text_seed(seed: int, split: str, epoch: int = 0) -> int:
    """Train and val never share text; each epoch of the stream reads new train text."""
    return seed * 1_000_003 + 2 * epoch + (split == "val")


class CharDataset(Dataset):
    """Non-overlapping windows of block_size characters: x, and y = x shifted by one character."""

    def __init__(self, block_size: int = 64, split: str = "train", num_chars: int = 65536, seed: int = 0) -> None:
        assert split in ("train", "val"), f"split must be 'train' or 'val', not {split!r}"
        self.block_size = block_size
        self.data = encode(make_text(num_chars + 1, _text_seed(seed, split)))

    def __len__(self) -> int:
        return (len(self.data) - 1) // self.block_size

    def __getitem__(self, i: int) -> Tuple[torch.Tensor, torch.Tensor]:
        chunk = self.data[i * self.block_size : (i + 1) * self.block_size + 1]
        return chunk[:-1], chunk[1:]


class _CharWindows(IterableDataset):
    """num_windows consecutive windows per epoch; each (rank, worker) takes every k-th one."""

    def __init__(self, block_size: int = 64, num_windows: int = 2048, seed: int = 0) -> None:
        from hpc_train import data_shard

        self.rank, self.world = data_shard()  # asked here: loader workers have no process group
        self.block_size, self.num_windows, self.seed = block_size, num_windows, seed
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def _shard(self) -> range:
        """Window numbers of this (rank, worker); every shard gets num_windows // k (the rest is dropped)."""
        info = get_worker_info()
        workers, worker = (info.num_workers, info.id) if info else (1, 0)
        k = self.world * workers
        return range(self.rank * workers + worker, (self.num_windows // k) * k, k)

    def _windows(self, start: int = 0) -> Iterator[Tuple[torch.Tensor, torch.Tensor]]:
        """The windows of this shard from its start-th one on."""
        shard = self._shard()[start:]
        if not shard:
            return
        B = self.block_size
        data = encode(make_text(self.num_windows * B + 1, _text_seed(self.seed, "train", self.epoch)))
        for j in shard:
            chunk = data[j * B : (j + 1) * B + 1]
            yield chunk[:-1], chunk[1:]

    def __iter__(self) -> Iterator[Tuple[torch.Tensor, torch.Tensor]]:
        return self._windows()


class CharStreamNoState(_CharWindows):
    """The stream without state_dict: a resumed job replays and skips the batches already trained on."""


class CharStream(_CharWindows):
    """The stream with state_dict/load_state_dict: a resumed iterator starts at the next window."""

    def __init__(self, block_size: int = 64, num_windows: int = 2048, seed: int = 0) -> None:
        super().__init__(block_size, num_windows, seed)
        self._yielded = 0  # windows this iterator has yielded in the current epoch
        self._resume = 0  # where the next iterator starts (set by load_state_dict, used once)

    def __iter__(self) -> Iterator[Tuple[torch.Tensor, torch.Tensor]]:
        # Counters move when iter() is called, not at the first next(): a state_dict taken in between is right.
        self._yielded, self._resume = self._resume, 0
        return self._counted(self._windows(self._yielded))

    def _counted(self, windows: Iterator) -> Iterator[Tuple[torch.Tensor, torch.Tensor]]:
        for window in windows:
            self._yielded += 1  # before yielding: the loader reads state_dict once the batch is made
            yield window

    def state_dict(self) -> Dict[str, int]:
        return {"epoch": self.epoch, "yielded": self._yielded}

    def load_state_dict(self, state: Dict[str, int]) -> None:
        self.epoch = int(state["epoch"])
        self._yielded = self._resume = int(state["yielded"])
