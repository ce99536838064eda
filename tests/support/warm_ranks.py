"""Ranks started warm in the tests: one fork server per pytest worker (hpc_train.compute.runtime.fork_server), which
a test module turns on with ``pytestmark = pytest.mark.usefixtures("warm_ranks")``.

The numeric-equivalence files start hundreds of ranks, each importing torch afresh; warm, each rank is a fork of a
process that imported it once. Files about signals, kills, hangs, ``/proc``, containers or thread settings keep
fresh ranks (they do not use the fixture). ``HPC_TRAIN_TEST_FRESH_RANKS=1`` turns it off for a whole session (to
measure, or to rule the warm start out).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Dict, Iterator, Optional

import pytest

from hpc_train.processes.warm_ranks import FORK_SERVER_VARIABLE, stats

FRESH_SWITCH = "HPC_TRAIN_TEST_FRESH_RANKS"
SERVER_START_S = 120.0


def server_env() -> Dict[str, str]:
    """The server's environment: the tests' own, as the local launcher hands it to a rank (GPUs hidden as run_cli
    hides them, no Slurm leftovers), one thread per library until a rank sets its own (no thread pool may run in the
    server when it forks)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SUBMITIT_", "TORCHELASTIC_"))}
    env.pop(FORK_SERVER_VARIABLE, None)
    env.update(CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    return env


def start_server(folder: Path) -> subprocess.Popen:
    """A fork server listening on folder/sock (its log: folder/server.log), once it is ready."""
    socket_path = folder / "sock"
    log = open(folder / "server.log", "w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "hpc_train.compute.runtime.fork_server", str(socket_path)],
        cwd=folder,
        env=server_env(),
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    log.close()
    deadline = time.monotonic() + SERVER_START_S
    while not socket_path.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError(f"the fork server did not start: {(folder / 'server.log').read_text()}")
        time.sleep(0.05)
    return proc


def fresh_env(**extra: str) -> Dict[str, str]:
    """This process's environment without the fork server, plus `extra`: a run_cli env whose ranks start fresh in a
    module that starts its ranks warm (a test about how a rank dies or is stopped)."""
    env = {k: v for k, v in os.environ.items() if k != FORK_SERVER_VARIABLE}
    env.update(extra)
    return env


@pytest.fixture(scope="session")
def fork_server() -> Iterator[Optional[Path]]:
    """This worker's fork server's socket (None with HPC_TRAIN_TEST_FRESH_RANKS=1); stopped at the session's end."""
    if os.environ.get(FRESH_SWITCH) == "1":
        yield None
        return
    folder = Path(tempfile.mkdtemp(prefix="hpc-fork-"))  # short: a Unix socket's path has at most 107 bytes
    proc = start_server(folder)
    try:
        yield folder / "sock"
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="module")
def warm_ranks(fork_server: Optional[Path]) -> Iterator[Optional[Path]]:
    """The local launcher starts this module's ranks warm (HPC_TRAIN_FORK_SERVER set while the module runs)."""
    if fork_server is None:
        yield None
        return
    previous = os.environ.get(FORK_SERVER_VARIABLE)
    os.environ[FORK_SERVER_VARIABLE] = str(fork_server)
    declined = len(stats(str(fork_server))["declined"])
    try:
        yield fork_server
    finally:
        if previous is None:
            os.environ.pop(FORK_SERVER_VARIABLE, None)
        else:
            os.environ[FORK_SERVER_VARIABLE] = previous
        said_no = stats(str(fork_server))["declined"][declined:]
        if said_no:  # those ranks ran fresh: right, but slower than the module asked for
            warnings.warn(f"the fork server started {len(said_no)} rank(s) fresh: {sorted(set(said_no))}", stacklevel=2)


def forks(server: Path) -> int:
    """How many ranks the server has started so far."""
    return int(stats(str(server))["forks"])
