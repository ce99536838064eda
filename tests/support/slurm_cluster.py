"""The local Slurm test cluster (scripts/slurm_test_cluster.sh): start it, point SLURM_CONF at it, and hold it
for one pytest session at a time. conftest's slurm_cluster fixtures call these."""

from __future__ import annotations

import fcntl
import os
import re
import shutil
import subprocess
import time

import pytest

from hpc_train.slurm import slurm_cli
from tests.support.paths import REPO

CLUSTER_SCRIPT = REPO / "scripts" / "slurm_test_cluster.sh"


# The suite's cluster: 4 nodes, hpcnode[1-4] (a flexible-size job needs nodes held by another job and nodes left
# free); `start` alone would start the script's default of 2 (and restart a running 4-node cluster to 2).
SUITE_NODES = 4

# The 16-node cluster of `start --nodes 16` (see the script's header, NODES): two name prefixes, so
# host lists compress to two ranges; partitions debug, gpu_p2, short (all nodes), hpc and gpu_a.
SCALE_NODES = 16
SCALE_NODELIST = "gpu-a[1-8],hpcnode[01-08]"  # as Slurm writes it (sorted by name)
SCALE_PARTITIONS = {"hpc": "hpcnode[01-08]", "gpu_a": "gpu-a[1-8]"}


def start_slurm_cluster(nodes: int = SUITE_NODES) -> None:
    """`slurm_test_cluster.sh start --nodes N` (a no-op when it already runs so), then point SLURM_CONF at it.

    In CI a cluster that does not come up fails the tests; elsewhere (no root, say) they skip.
    """
    proc = subprocess.run(
        ["bash", str(CLUSTER_SCRIPT), "start", "--nodes", str(nodes)], capture_output=True, text=True, timeout=900
    )
    if proc.returncode != 0:
        message = f"the Slurm test cluster did not start:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
        if os.environ.get("CI") == "true" or os.geteuid() == 0:
            pytest.fail(message)
        pytest.skip(message)
    env = subprocess.run(["bash", str(CLUSTER_SCRIPT), "env"], capture_output=True, text=True, check=True).stdout
    for key, value in re.findall(r"^export (\w+)=(\S+)$", env, flags=re.M):
        os.environ[key] = value.strip("'\"")  # every sbatch/scontrol the tests run (and the CLI) talks to this cluster
    assert shutil.which("sbatch") and shutil.which("scontrol")
    slurm_cli.forget_answers()  # what this process asked the cluster before it was (re)started, its size say


def reset_association_limits() -> None:
    """No MaxSubmitJobs or MaxJobs on root's hpctest association: a test sets one for itself and lifts it when it ends,
    but a
    session killed inside that test (kill -9, a CI timeout) leaves it on the running cluster for the next session."""
    subprocess.run(
        [
            "sacctmgr",
            "-i",
            "modify",
            "user",
            "root",
            "where",
            "account=hpctest",
            "set",
            "maxsubmitjobs=-1",
            "maxjobs=-1",
        ],
        capture_output=True,
        timeout=60,
    )


_session_lock = None  # the open lock file while this session holds the cluster


def cluster_dir() -> str:
    """The test cluster's state folder (scripts/slurm_test_cluster.sh's HPC_TRAIN_SLURM_DIR, and its default)."""
    return os.environ.get("HPC_TRAIN_SLURM_DIR", "/tmp/hpc-train-slurm").rstrip("/")


def hold_cluster(exclusive: bool) -> None:
    """Hold the test cluster for the rest of this pytest session: shared by the sessions that use the
    suite's cluster, exclusive for one that resizes it (`start --nodes 16` ends every running job).

    A second pytest session on the same machine waits for the other (at most 8 minutes, then fails).
    """
    global _session_lock
    if _session_lock is None:
        state_dir = cluster_dir()
        _session_lock = open(f"{state_dir}.sessions.lock", "a+")
    mode = fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH
    deadline = time.monotonic() + 480
    while True:
        try:
            fcntl.flock(_session_lock, mode | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() > deadline:
                pytest.fail(f"another pytest session held the Slurm test cluster for 8 minutes: {_session_lock.name}")
            time.sleep(2)
