"""Our Slurm host-list parser: known cases and clear errors."""

from __future__ import annotations

import pytest

from hpc_train.slurm.hostlist import HostlistError, expand_hostlist, first_host


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
