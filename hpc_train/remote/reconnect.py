"""A laptop that follows a cluster's jobs rides out a dropped connection (``Job.wait()``, ``hpc-train-report
--watch``): it says once that the connection dropped, opens it again, and looks again; the jobs on the cluster never
noticed. Only after GIVE_UP_S without a connection is the connection's own error raised."""

from __future__ import annotations

import time
from typing import Callable, Optional, TypeVar

from hpc_train.errors import Unreachable
from hpc_train.hosts.ssh import LOGIN_KEY
from hpc_train.remote.connection import Connection
from hpc_train.remote.settings import RemoteSettings

T = TypeVar("T")
RETRY_S = 5.0  # between two tries to open the connection again
GIVE_UP_S = 600.0  # without a connection this long, the follower stops with the connection's error


class Reconnecting:
    """The connection of ``settings``, opened on first use and again after it dropped."""

    def __init__(self, settings: RemoteSettings) -> None:
        self.settings = settings
        self.conn: Optional[Connection] = None
        self.multiplexed = False  # a control master was open once: one that is gone is a dropped connection
        self.opened = False  # connected once: a later failure is a dropped connection, retried

    def connection(self) -> Connection:
        if self.conn is None:
            conn = Connection(self.settings)
            conn.open()
            self.multiplexed = self.multiplexed or conn.target.master_alive()
            self.conn, self.opened = conn, True
        return self.conn

    def run(self, action: Callable[[Connection], T]) -> T:
        """``action`` on the open connection; when the connection dropped (during it, or its control master is
        gone after it), reopened and ``action`` run again, for up to GIVE_UP_S."""
        lost_at: Optional[float] = None
        while True:
            try:
                result = action(self.connection())
                assert self.conn is not None
                if not self.multiplexed or self.conn.target.master_alive():
                    if lost_at is not None:
                        print(
                            f"hpc-train: reconnected to {self.settings.login} after {time.monotonic() - lost_at:.0f} s",
                            flush=True,
                        )
                    return result
                problem = "its control connection ended"
            except Unreachable as err:  # a fetch whose connection ended is one too (Connection.failure)
                gave_up = lost_at is not None and time.monotonic() - lost_at > GIVE_UP_S
                if err.key != LOGIN_KEY or not self.opened or gave_up:  # never connected: its error at once
                    raise
                problem = err.problem
            if lost_at is None:
                lost_at = time.monotonic()
                print(
                    f"hpc-train: the connection to {self.settings.login} dropped ({problem.rstrip('.')}); reconnecting"
                    " (the jobs go on on the cluster)",
                    flush=True,
                )
            else:
                time.sleep(RETRY_S)
            self.conn = None
