"""A command forwarded to the cluster's hpc_train: started detached there (``serve start``), its output followed
here as it comes, Ctrl-C passed on as Ctrl-C, its exit status and refusal brought back as data.

A dropped connection stops the following, not the command: a submission on the cluster finishes whole (or, after
Ctrl-C, cancels what it queued), and the local run dir's link says where to find it (``hpc-train-report``).
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional

from hpc_train.errors import HpcTrainError
from hpc_train.processes.signal_relay import handling
from hpc_train.remote import mirror
from hpc_train.remote.connection import Connection
from hpc_train.remote.settings import RemoteLink, write_link

INTERRUPT_WAIT_S = 120.0  # after Ctrl-C, how long the cancelled queueing's words are followed


@dataclass(frozen=True)
class Outcome:
    """How the forwarded command ended: its exit status, and its refusal as data when it refused its input."""

    code: int
    refusal: Optional[Dict[str, Any]]


class Dropped(HpcTrainError):
    """The connection dropped while the command ran on the cluster (where it goes on). Not an ``Unreachable``: the
    command is not to be run again (it would submit again), nor the following retried; the command's callers say it
    and exit 1, pointing at hpc-train-report."""


def forward(conn: Connection, module: str, args: List[str], local: Path, remote: str) -> Outcome:
    """Run ``python -m MODULE ARGS`` on the cluster for the run (or sweep) dir ``local`` (``remote`` there)."""
    ident = f"{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:8]}"
    link = RemoteLink(conn.target.login, remote, conn.settings.python, list(conn.settings.setup), ident)
    write_link(local, link)  # before anything starts: a later command finds the cluster's copy whatever happens
    assert conn.cluster is not None, "open() the connection first"
    # Ctrl-C is a KeyboardInterrupt inside, even in a process started with SIGINT ignored (a background job of a
    # script, a test runner's worker): it is the one way to stop what the cluster queues.
    with handling([signal.SIGINT], signal.default_int_handler):
        return _forwarded(conn, module, args, local, link)


def _forwarded(conn: Connection, module: str, args: List[str], local: Path, link: RemoteLink) -> Outcome:
    assert conn.cluster is not None
    ident = link.command
    conn.serve_json("start", ident, module, "--", *args, cwd=conn.cluster.project)  # run where the project is
    seen = 0
    try:
        seen = _follow(conn, ident, seen)
    except Dropped as dropped:
        raise Dropped(
            f"hpc-train: the connection to {conn.target.login} dropped while the cluster's hpc-train ran ({dropped})."
            " It goes on there, detached: a submission ends whole, or not at all. What it queued:"
            f" hpc-train-report {local} (from this machine; it reconnects)"
        ) from None
    except KeyboardInterrupt:
        conn.serve_json("interrupt", ident)
        print("hpc-train: Ctrl-C passed on to the cluster's hpc-train (what it queued is cancelled)", file=sys.stderr)
        deadline = time.monotonic() + INTERRUPT_WAIT_S
        while time.monotonic() < deadline:
            seen = _follow(conn, ident, seen)
            if "code" in conn.serve_json("result", ident):
                break
    found = conn.serve_json("result", ident)
    mirror.refresh(conn, local, link)
    return Outcome(int(found.get("code", 1)), found.get("refusal"))


def _follow(conn: Connection, ident: str, offset: int) -> int:
    """Copy the command's output from ``offset`` to ours until it ends; the offset reached."""
    process = conn.host.popen(
        conn.serve_words("follow", ident, str(offset)), stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    assert process.stdout is not None and process.stderr is not None
    out = sys.stdout.buffer
    while True:
        chunk = process.stdout.read1(65536) if hasattr(process.stdout, "read1") else process.stdout.read(65536)
        if not chunk:
            break
        out.write(chunk)
        out.flush()
        offset += len(chunk)
    said = process.stderr.read().decode(errors="replace")
    code = process.wait()
    if code != 0:  # serve's follow itself only ends well: this is the session that ended (a killed master: no words)
        raise Dropped(said.strip().splitlines()[-1] if said.strip() else f"the ssh session ended with status {code}")
    return offset
