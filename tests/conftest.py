"""Fixtures and hooks for every tier (tests/unit, tests/e2e, tests/slurm); the helpers they use live in
tests/support."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import pytest

from tests.support.cli import run_cli
from tests.support.no_process import processes_refused
from tests.support.slurm_cluster import SCALE_NODES, hold_cluster, reset_association_limits, start_slurm_cluster
from tests.support.warm_ranks import fork_server, warm_ranks  # noqa: F401  # fixtures: ranks started warm

UNIT_TIER = Path(__file__).resolve().parent / "unit"
E2E_TIER = Path(__file__).resolve().parent / "e2e"


@pytest.fixture
def cli():
    return run_cli


# -- the unit tier starts no process -----------------------------------------------------------
def _guarded(item) -> contextlib.AbstractContextManager:
    """A test under tests/unit runs (its setup too) with processes refused; any other test runs as it is.
    Teardown is left out: the last test of a session tears down session fixtures (the 16-node cluster's restart)."""
    if UNIT_TIER not in item.path.resolve().parents:
        return contextlib.nullcontext()
    _import_torch_once()
    return processes_refused()


def _import_torch_once() -> None:
    """torch's first import runs `ldconfig -p` (CUDA's library finder looks for libdl): an import-time probe of the
    library, not the test starting a process. Done before the guard, as a test module that imports torch at its top
    does at collection, so that a test which imports torch first in its body passes alone as in the whole tier."""
    # torch (seconds): only once, and only for a unit test
    import torch  # noqa: F401


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item):
    with _guarded(item):
        yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    with _guarded(item):
        yield


# -- the real Slurm test cluster -------------------------------------------------------------
@pytest.fixture(scope="session")
def slurm_cluster():
    """Start (or reuse) the local Slurm cluster: munge + slurmdbd + slurmctld + 4 slurmd nodes (SUITE_NODES)."""
    hold_cluster(exclusive=False)
    start_slurm_cluster()
    reset_association_limits()
    yield
    # Leave the cluster running for the next session; scripts/slurm_test_cluster.sh stop ends it.


@pytest.fixture(scope="session")
def slurm_cluster_16():
    """The local Slurm cluster restarted with 16 nodes, hpcnode[01-08] and gpu-a[1-8] (SCALE_* in
    tests/support/slurm_cluster.py).

    Any test that uses it is a `scale` test (marked so at collection, deselected unless `-m` names
    scale) and runs after every other test of the session; at the end of the session the default
    4-node cluster is started again, so the next run finds what `slurm_cluster` expects. Other
    pytest sessions on this machine that use the cluster wait meanwhile (hold_cluster).
    """
    hold_cluster(exclusive=True)
    start_slurm_cluster(SCALE_NODES)
    try:
        yield
    finally:
        start_slurm_cluster()
        hold_cluster(exclusive=False)


@pytest.hookimpl(tryfirst=True)
def _xdist_group(item) -> str:
    """scripts/test.sh runs the suite on 2 pytest-xdist workers with --dist loadgroup: every test that uses the
    Slurm test cluster in one group (one worker, one job at a time on the cluster, as in a serial run; its waits
    overlap the other worker's CPU work), every other file a group of its own (its module fixtures built once)."""
    names = getattr(item, "fixturenames", ())
    if item.get_closest_marker("slurm") or "slurm_cluster" in names or "slurm_cluster_16" in names:
        return "slurm"
    return item.path.name


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's own hook, which reads the xdist_group marks set here
def pytest_collection_modifyitems(config, items):
    """`scale` tests (16-node cluster): deselected unless `-m` or a file named on the command line
    picks them; when selected, they run last.

    Deselected rather than skipped, so the default run reports no skips for them. Running last
    keeps the 2-node tests of a mixed run (`-m "slurm or scale"`) on the 2-node cluster.
    """
    for item in items:
        if "slurm_cluster_16" in getattr(item, "fixturenames", ()) and item.get_closest_marker("scale") is None:
            item.add_marker(pytest.mark.scale)
        item.add_marker(pytest.mark.xdist_group(_xdist_group(item)))
    items.sort(key=_longest_first)
    scale = [item for item in items if item.get_closest_marker("scale") is not None]
    if not scale:
        return
    if "scale" not in (config.getoption("markexpr") or ""):
        named = {(config.invocation_params.dir / arg.split("::")[0]).resolve() for arg in config.args}
        dropped = [item for item in scale if item.path.resolve() not in named]
        if dropped:
            config.hook.pytest_deselected(items=dropped)
        scale = [item for item in scale if item not in dropped]
    items[:] = [item for item in items if item.get_closest_marker("scale") is None] + scale


def _longest_first(item) -> int:
    """The order of the groups, which scripts/test.sh keeps (--no-loadscope-reorder; xdist would order them by test
    count): the Slurm group first (the longest, one test after the other), then the e2e files (real runs), then the
    unit files (seconds each), which fill the last minutes of both workers. A stable sort: within a tier, the
    collection's order."""
    if _xdist_group(item) == "slurm":
        return 0
    return 1 if E2E_TIER in item.path.resolve().parents else 2


def pytest_configure(config):
    """Refuse a --dist loadgroup run the installed pytest-xdist cannot group: with pytest >= 9.2, xdist <= 3.8 drops
    the groups silently (pytest-xdist#1386) and the Slurm tests would run on both workers at once."""
    if os.environ.get("PYTEST_XDIST_WORKER") or config.getoption("dist", "no") != "loadgroup":
        return
    import xdist
    from packaging.version import Version

    if Version(pytest.__version__) >= Version("9.2") and Version(xdist.__version__) < Version("3.9"):
        raise pytest.UsageError(
            f"pytest {pytest.__version__} with pytest-xdist {xdist.__version__} ignores --dist loadgroup's groups"
            " (pytest-xdist#1386). Fix: install with -c constraints.txt (pytest<9.2), as scripts/test.sh does."
        )


def pytest_collection_finish(session):
    """A worker of a --dist loadgroup run holds only grouped tests; a test without its group (a newer pytest/xdist
    pair with the same fault) stops the run instead of letting the Slurm tests share the cluster."""
    if not getattr(session.config.option, "loadgroup", False):
        return
    lost = [item.nodeid for item in session.items if "@" not in item.nodeid.rpartition("]")[2].rpartition("::")[2]]
    if lost:
        raise pytest.UsageError(f"pytest-xdist lost the test groups of {len(lost)} tests, e.g. {lost[0]}")
