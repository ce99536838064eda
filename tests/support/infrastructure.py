"""Start the suite's test infrastructure before pytest (scripts/test.sh runs `python -m tests.support.infrastructure`
once the packages are installed): the Slurm test cluster with the suite's node count, then the SSH test server in
front of it. The fixtures that need them (`slurm_cluster`, the laptop's) start them too when a test runs alone, and
find them up here (about a second each). The container tests need nothing started: crun is installed with the
cluster's packages, and their image is built in well under a second by the test that uses it.
"""

from __future__ import annotations

import subprocess
import sys
import time

from tests.support.slurm_cluster import CLUSTER_SCRIPT, SUITE_NODES
from tests.support.ssh_server import start_ssh_server


def start_cluster() -> None:
    proc = subprocess.run(
        ["bash", str(CLUSTER_SCRIPT), "start", "--nodes", str(SUITE_NODES)], capture_output=True, text=True, timeout=900
    )
    if proc.returncode != 0:
        raise RuntimeError(f"the Slurm test cluster did not start:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")


def main() -> int:
    """Start each part in turn (the SSH server puts its user into the cluster's accounting); one line each."""
    for name, start in (("the Slurm test cluster", start_cluster), ("the SSH test server", start_ssh_server)):
        began = time.monotonic()
        try:
            start()
        except (RuntimeError, subprocess.SubprocessError) as error:
            said = f"{name} did not start (its tests will say why)"
            print(f"tests.support.infrastructure: {said}:\n{error}", file=sys.stderr)
            return 1
        print(f"tests.support.infrastructure: {name} is up ({time.monotonic() - began:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
