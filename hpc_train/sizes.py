"""Byte counts in words, written one way everywhere: the largest unit in which the count is at least 1, with one
decimal (``41.2 GiB``, ``952.3 MiB``, ``640.0 KiB``), and whole bytes below a KiB (``512 B``)."""

from __future__ import annotations

KIB = 2**10
MIB = 2**20
GIB = 2**30
TIB = 2**40
_UNITS = (("TiB", TIB), ("GiB", GIB), ("MiB", MIB), ("KiB", KIB))


def size_text(count: float) -> str:
    """`count` bytes in words: ``41.2 GiB``, ``512 B``."""
    for unit, scale in _UNITS:
        if abs(count) >= scale:
            return f"{count / scale:.1f} {unit}"
    return f"{int(count)} B"
