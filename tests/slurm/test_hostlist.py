"""Our Slurm host-list parser: known cases, clear errors, and agreement with the real `scontrol show hostnames`."""

from __future__ import annotations

import random
import subprocess
import time
from typing import List, Optional

import pytest

from hpc_train.hostlist import HostlistError, expand_hostlist, first_host


@pytest.mark.parametrize(
    "nodelist, hosts",
    [
        ("node01", ["node01"]),
        ("node[01-03,07]", ["node01", "node02", "node03", "node07"]),
        ("gpu[1-2],cpu5", ["gpu1", "gpu2", "cpu5"]),
        ("r[1-2]n[08-09]", ["r1n08", "r1n09", "r2n08", "r2n09"]),
        ("jean-zay-iam[12,40-41]", ["jean-zay-iam12", "jean-zay-iam40", "jean-zay-iam41"]),
        ("n[8-010]", ["n8", "n9", "n10"]),  # the low end's width is the padding
        ("n[098-100]", ["n098", "n099", "n100"]),
        ("a[2,1],a1", ["a2", "a1", "a1"]),  # order and duplicates kept, as scontrol does
    ],
)
def test_expand_hostlist(nodelist, hosts):
    assert expand_hostlist(nodelist) == hosts
    assert first_host(nodelist) == hosts[0]


@pytest.mark.parametrize(
    "nodelist, says",
    [
        ("node[1-3", "never closed"),
        ("node1-3]", "without a matching"),
        ("node[a-c]", "not a number"),
        ("node1 node2", "whitespace"),
        ("node[1-2], node3", "whitespace"),
        ("", "empty"),
        ("a,,b", "empty entry"),
        ("a[]", "empty brackets"),
        ("a[1-]", "not a number"),
        ("a[3-1]", "backwards"),
        ("a[[1-2]]", "nested"),
        ("a[0-70000]", "more than 65536"),
    ],
)
def test_malformed_lists_raise_a_clear_value_error(nodelist, says):
    with pytest.raises(ValueError) as caught:
        expand_hostlist(nodelist)
    assert isinstance(caught.value, HostlistError)
    assert repr(nodelist) in str(caught.value) and says in str(caught.value)


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
            disagreements.append(f"{nodelist!r}: scontrol {expected if expected is None else expected[:6]}, ours {got if got is None else got[:6]}")
    assert not disagreements, f"{len(disagreements)} of {len(lists)} lists differ:\n" + "\n".join(disagreements[:20])
    assert time.monotonic() - started < 30
