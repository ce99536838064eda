"""Expand Slurm host lists such as ``node[01-03,07]`` without calling ``scontrol``.

Compute nodes do not always have ``scontrol`` on PATH (containers, minimal images), and the
first host of the node list is all a rank needs to find its rendezvous address.
"""

from __future__ import annotations

import re
from typing import List

_BRACKET = re.compile(r"\[([^\]]*)\]")


def _split_top_level(text: str) -> List[str]:
    """Split on commas that are not inside brackets: ``a[1,2],b`` -> ``['a[1,2]', 'b']``."""
    parts, depth, current = [], 0, []
    for char in text:
        if char == "[":
            depth += 1
        elif char == "]":
            depth -= 1
        if char == "," and depth == 0:
            parts.append("".join(current))
            current = []
        else:
            current.append(char)
    if current:
        parts.append("".join(current))
    return [p.strip() for p in parts if p.strip()]


def _expand_range(spec: str) -> List[str]:
    """``01-03,07`` -> ``['01', '02', '03', '07']``, keeping zero padding."""
    values: List[str] = []
    for item in spec.split(","):
        item = item.strip()
        if "-" in item:
            lo, hi = item.split("-", 1)
            width = len(lo)
            values.extend(str(n).zfill(width) for n in range(int(lo), int(hi) + 1))
        elif item:
            values.append(item)
    return values


def _expand_one(pattern: str) -> List[str]:
    match = _BRACKET.search(pattern)
    if match is None:
        return [pattern]
    head, tail = pattern[: match.start()], pattern[match.end() :]
    return [head + value + rest for value in _expand_range(match.group(1)) for rest in _expand_one(tail)]


def expand_hostlist(nodelist: str) -> List[str]:
    """Return every host named by a Slurm node list, in Slurm's order."""
    hosts: List[str] = []
    for part in _split_top_level(nodelist):
        hosts.extend(_expand_one(part))
    return hosts


def first_host(nodelist: str) -> str:
    """The first host of a Slurm node list (the rendezvous host of a job)."""
    hosts = expand_hostlist(nodelist)
    if not hosts:
        raise ValueError(f"empty Slurm node list: {nodelist!r}")
    return hosts[0]
