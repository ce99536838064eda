"""The local launcher's rendezvous port cannot be taken between the launcher's choice and rank 0's store: the
launcher listens on it from the start and rank 0 serves on that very socket (hpc_train.launch.backends.local.processes,
hpc_train.compute.runtime.distributed)."""

import datetime
import errno
import socket
from concurrent.futures import ThreadPoolExecutor

import pytest

from hpc_train.compute.runtime.distributed import handed_store
from hpc_train.compute.runtime.ranks import RankInfo
from hpc_train.launch.backends.local.processes import master_listener
from hpc_train.processes.rank_env import MASTER_FD_VARIABLE


def _rank(rank: int, port: int) -> RankInfo:
    return RankInfo(rank, rank, 2, 2, "127.0.0.1", port, "local")


def test_another_process_cannot_bind_the_port_before_rank_0_serves_on_it():
    listener = master_listener()
    port = listener.getsockname()[1]
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as other:  # another run's socket, drawing ports
            other.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as torch's store binds
            with pytest.raises(OSError) as taken:
                other.bind(("127.0.0.1", port))
        assert taken.value.errno == errno.EADDRINUSE
    finally:
        listener.close()


def test_rank_0_serves_the_rendezvous_on_the_handed_socket(monkeypatch):
    listener = master_listener()
    port = listener.getsockname()[1]
    monkeypatch.setenv(MASTER_FD_VARIABLE, str(listener.fileno()))
    timeout = datetime.timedelta(seconds=30)
    with ThreadPoolExecutor(1) as pool:
        client = pool.submit(handed_store, _rank(1, port), timeout)  # rank 1 first: it waits in the queue
        server = handed_store(_rank(0, port), timeout)  # waits for rank 1, as torch's own rendezvous does
        listener.detach()  # the store owns the descriptor now
        client.result().set("from rank 1", "hello")
    assert server.get("from rank 1") == b"hello"


def test_without_a_handed_socket_the_rendezvous_is_torchs_own(monkeypatch):
    monkeypatch.delenv(MASTER_FD_VARIABLE, raising=False)
    assert handed_store(_rank(0, 29500), datetime.timedelta(seconds=1)) is None
