"""Our Slurm host-list parser agrees with the real `scontrol show hostnames` (its known cases and errors:
tests/unit/test_hostlist_parser.py)."""

from __future__ import annotations

import random
import subprocess
import time
from typing import List, Optional

import pytest

from hpc_train.slurm.hostlist import HostlistError, expand_hostlist


# -- differential test against Slurm's own parser --------------------------------------------
def _number(rng: random.Random) -> str:
    return str(rng.choice([0, 1, 2, 7, 9, 10, 42, 99, 100, 998, rng.randint(0, 5000)]))


def _bracket(rng: random.Random) -> str:
    items = []
    for _ in range(rng.randint(1, 3)):
        lo = rng.randint(0, 120)
        width = rng.choice([1, 1, 2, 3, 4])
        lo_text = str(lo).zfill(width)
        if rng.random() < 0.6:
            hi = lo + rng.randint(0, 12)
            items.append(f"{lo_text}-{str(hi).zfill(rng.choice([1, width]))}")
        else:
            items.append(lo_text)
    return "[" + ",".join(items) + "]"


def _entry(rng: random.Random) -> str:
    prefix = rng.choice(["node", "n", "gpu-", "r", "jean-zay-iam", "cn.a_", "x9y"])
    if rng.random() < 0.25:
        return prefix + rng.choice(["", _number(rng)])  # a plain host
    text = prefix
    for group in range(rng.randint(1, 3)):
        if group:
            text += rng.choice(["", "n", "-s", "b"])
        text += _bracket(rng)
    return text  # Slurm 22.05 refuses text after the last bracket, so none is generated


def generated_lists(count: int, seed: int = 16) -> List[str]:
    rng = random.Random(seed)
    return [",".join(_entry(rng) for _ in range(rng.randint(1, 4))) for _ in range(count)]


def scontrol_hostnames(nodelist: str) -> Optional[List[str]]:
    """Slurm's expansion, or None when Slurm calls the list invalid (it says so on stderr)."""
    proc = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True, timeout=30)
    if proc.returncode != 0 or proc.stderr.strip():
        return None
    return proc.stdout.split()


def ours(nodelist: str) -> Optional[List[str]]:
    try:
        return expand_hostlist(nodelist)
    except HostlistError:
        return None


@pytest.mark.slurm
def test_parser_agrees_with_scontrol_show_hostnames(slurm_cluster):
    lists = generated_lists(400) + ["node[1-3]", "a[0-65535]", "a[0-65536]", "node[a-c]", "a[3-1]", "a[[1]]", "a[1,,2]"]
    started = time.monotonic()
    disagreements = []
    for nodelist in lists:
        expected, got = scontrol_hostnames(nodelist), ours(nodelist)
        if expected != got:
            disagreements.append(
                f"{nodelist!r}: scontrol {expected if expected is None else expected[:6]}, "
                f"ours {got if got is None else got[:6]}"
            )
    assert not disagreements, f"{len(disagreements)} of {len(lists)} lists differ:\n" + "\n".join(disagreements[:20])
    assert time.monotonic() - started < 30
