"""Expand Slurm host lists such as ``node[01-03,07]`` without calling ``scontrol``.

Why our own parser: compute nodes do not always have ``scontrol`` on PATH (containers, minimal
images), python-hostlist is GPL and submitit's parser is private. It follows
``scontrol show hostnames`` (tests compare the two on generated lists): top-level commas
separate entries; an entry may hold several bracket groups (``r[1-2]n[08-09]`` -> r1n08 r1n09
r2n08 r2n09; with three or more, Slurm's own order, see :func:`_expand_entry`); a range keeps the
zero padding of its low end
(``[08-10]`` -> 08 09 10, ``[1-010]`` -> 1 ... 10); order and duplicates are kept. Unlike
Slurm it also expands text after the last bracket (``n[1-2]-ib``).

A malformed list (an unclosed bracket, letters in a range, a range running backwards,
whitespace, an empty entry or list) raises :class:`HostlistError` naming the list: a wrong
rendezvous host would otherwise show up much later as a hang.
"""

from __future__ import annotations

import itertools
import re
from typing import List

from hpc_train.errors import HpcTrainError

MAX_RANGE = 65536  # Slurm's own limit on the hosts of one range
_NUMBERS = re.compile(r"^(\d+)(?:-(\d+))?$")


class HostlistError(HpcTrainError, ValueError):
    """A Slurm node list that cannot be expanded; the message names the list and what is wrong."""

    def __init__(self, nodelist: str, problem: str) -> None:
        super().__init__(f"malformed Slurm node list {nodelist!r}: {problem}")
        self.nodelist = nodelist


def _split_top_level(nodelist: str) -> List[str]:
    """Split on commas outside brackets: ``a[1,2],b`` -> ``['a[1,2]', 'b']``; checks bracket balance."""
    parts, depth, current = [], 0, []
    for char in nodelist:
        if char == "[":
            if depth:
                raise HostlistError(nodelist, "nested '['")
            depth = 1
        elif char == "]":
            if not depth:
                raise HostlistError(nodelist, "']' without a matching '['")
            depth = 0
        if char == "," and not depth:
            parts.append("".join(current))
            current = []
        else:
            current.append(char)
    if depth:
        raise HostlistError(nodelist, "'[' is never closed")
    parts.append("".join(current))
    if any(not part for part in parts):
        raise HostlistError(nodelist, "empty entry between commas")
    return parts


def _expand_range(nodelist: str, spec: str) -> List[str]:
    """``01-03,07`` -> ``['01', '02', '03', '07']``: the low end's width is the padding."""
    values: List[str] = []
    for item in spec.split(","):
        match = _NUMBERS.match(item)
        if match is None:
            raise HostlistError(nodelist, f"[{spec}]: {item!r} is not a number or a range of numbers like 1-4")
        lo, hi = match.group(1), match.group(2) or match.group(1)
        if int(hi) < int(lo):
            raise HostlistError(nodelist, f"[{spec}]: the range {item!r} runs backwards")
        if int(hi) - int(lo) + 1 > MAX_RANGE:
            raise HostlistError(nodelist, f"[{spec}]: the range {item!r} names more than {MAX_RANGE} hosts")
        values.extend(str(n).zfill(len(lo)) for n in range(int(lo), int(hi) + 1))
    return values


def _expand_entry(nodelist: str, entry: str) -> List[str]:
    """One top-level entry: its text and bracket groups, expanded as a product in Slurm's order.

    Slurm varies the last group fastest; the others, from the one before last (slowest) down to
    the first: ``a[1-2]b[3-4]c[5-6]`` -> a1b3c5 a1b3c6 a2b3c5 a2b3c6 a1b4c5 ... (the first
    host is the same in any order).
    """
    texts, groups = [], []
    for text, bracket in re.findall(r"([^\[]*)(?:\[([^\]]*)\])?", entry):
        texts.append(text)
        if bracket:
            groups.append(_expand_range(nodelist, bracket))
    if not groups:
        return ["".join(texts)]
    order = [*range(len(groups) - 2, -1, -1), len(groups) - 1]  # slowest first
    hosts = []
    for picked in itertools.product(*(groups[g] for g in order)):
        values = dict(zip(order, picked))
        hosts.append("".join(text + values.get(i, "") for i, text in enumerate(texts)))
    return hosts


def expand_hostlist(nodelist: str) -> List[str]:
    """Every host named by a Slurm node list, in Slurm's order; raises HostlistError if malformed."""
    if not nodelist:
        raise HostlistError(nodelist, "it is empty")
    if any(char.isspace() for char in nodelist):
        raise HostlistError(nodelist, "it contains whitespace (Slurm separates hosts with commas)")
    if "[]" in nodelist:
        raise HostlistError(nodelist, "empty brackets []")
    hosts: List[str] = []
    for entry in _split_top_level(nodelist):
        hosts.extend(_expand_entry(nodelist, entry))
    return hosts


def first_host(nodelist: str) -> str:
    """The first host of a Slurm node list (the rendezvous host of a job)."""
    return expand_hostlist(nodelist)[0]
