"""A job a laptop follows on a cluster (its run dir's ``remote.json``): the backend's own watch, with Slurm asked
over the connection and the run dir's records brought up to date before each look; a dropped connection is opened
again (hpc_train.remote.reconnect), as ``hpc-train-report --watch`` does."""

from __future__ import annotations

import time
from typing import Callable, Optional, TypeVar

from hpc_train.hosts import hosts
from hpc_train.launch.backends.base import JobWatch
from hpc_train.remote import mirror
from hpc_train.remote.connection import Connection
from hpc_train.remote.reconnect import Reconnecting
from hpc_train.remote.settings import RemoteLink

T = TypeVar("T")
REMOTE_POLL_S = 3.0  # a look costs a few round trips: not every second


class RemoteWatch(JobWatch):
    """``inner`` (the launcher's watch) run against the cluster of ``link``."""

    def __init__(self, inner: JobWatch, link: RemoteLink) -> None:
        super().__init__(inner.ref)
        self.inner, self.link = inner, link
        self.poll_s = max(inner.poll_s, REMOTE_POLL_S)
        self.reconnecting = Reconnecting(link.settings())
        self._refreshed = 0.0

    def connection(self) -> Connection:
        return self.reconnecting.connection()

    def refresh(self, at_most_every: float = 1.0) -> None:
        """The run dir's records as the cluster has them now (skipped when fetched less than a second ago)."""
        self.on_cluster(lambda: self._refresh(at_most_every))

    def _refresh(self, at_most_every: float) -> None:
        if time.monotonic() - self._refreshed < at_most_every:
            return
        mirror.refresh(self.connection(), self.ref.run_dir, self.link)
        self._refreshed = time.monotonic()

    def on_cluster(self, look: Callable[[], T]) -> T:
        """``look`` with Slurm's commands sent to the cluster and the records fresh; run again after a reconnection
        (what it read while the connection dropped is not trusted)."""

        def there(conn: Connection) -> T:
            with hosts.commands_on(conn.host):
                self._refresh(1.0)
                return look()

        return self.reconnecting.run(there)

    def state(self) -> str:
        return self.on_cluster(self.inner.state)

    def cancel(self) -> None:
        self.on_cluster(self.inner.cancel)

    def exit_code(self) -> Optional[int]:
        return self.inner.exit_code()

    @property
    def command_is_the_job(self) -> bool:
        return self.inner.command_is_the_job
