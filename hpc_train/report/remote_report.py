"""``hpc-train-report`` on a laptop, for a run (or sweep) dir whose jobs run on a cluster (its ``remote.json``):
the records the report reads are brought up to date over the connection and Slurm is asked there; a rerun is the
cluster's hpc_train's to submit; ``--fetch`` copies the whole run dir back (checkpoints, event files, traces)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Callable, NoReturn, Optional, Union

from hpc_train.config.errors import ConfigError
from hpc_train.errors import Unreachable
from hpc_train.hosts import hosts
from hpc_train.launch.hydra import exits
from hpc_train.remote import mirror
from hpc_train.remote.connection import Connection
from hpc_train.remote.forward import Dropped, forward
from hpc_train.remote.reconnect import Reconnecting
from hpc_train.remote.settings import RemoteLink, read_link

REPORT_MODULE = "hpc_train.report.command"


def link_of(path: Path) -> Optional[RemoteLink]:
    return read_link(path) if path.is_dir() else None


def _said(err: Union[ConfigError, Unreachable]) -> NoReturn:
    """The connection's problem, one message, and the hpc-train command's exit code for it (5: the cluster cannot be
    reached, 2: refused); a --watch stops here."""
    print(exits.one_message(err).replace("hpc-train:", "hpc-train-report:", 1), file=sys.stderr)
    raise SystemExit(exits.exit_code(err))


def rerun_on_cluster(path: Path, link: RemoteLink) -> int:
    """``--rerun-failed`` run by the cluster's hpc_train (it submits); the records brought back after."""
    try:
        conn = Connection(link.settings())
        conn.open()
        outcome = forward(conn, REPORT_MODULE, [link.path, "--rerun-failed"], path, link.path)
    except Dropped as dropped:
        print(dropped, file=sys.stderr)
        return 1
    except (ConfigError, Unreachable) as err:
        _said(err)
    return outcome.code


def prepare(path: Path, link: RemoteLink, everything: bool) -> Callable[[], None]:
    """Bring ``path`` up to date (``everything``: all files), send this process's Slurm commands to the cluster;
    returns the refresh a ``--watch`` runs before each redraw, which reconnects as ``Job.wait()`` does
    (hpc_train.remote.reconnect)."""
    reconnecting = Reconnecting(link.settings())

    def fetch(conn: Connection, everything: bool = False) -> int:
        hosts.use(conn.host)  # a reconnection's host for this process's Slurm commands
        return mirror.refresh(conn, path, link, everything=everything)

    try:
        count = reconnecting.run(lambda conn: fetch(conn, everything))
    except (ConfigError, Unreachable) as err:
        _said(err)
    if everything:
        print(f"hpc-train-report: fetched {count} file(s) of {link.login}:{link.path} into {path}", file=sys.stderr)

    def refresh() -> None:
        try:
            reconnecting.run(fetch)
        except (ConfigError, Unreachable) as err:  # no connection for minutes: the next --watch goes on
            _said(err)

    return refresh
