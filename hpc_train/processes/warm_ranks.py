"""Ranks started warm: the local launcher's side of the fork server (a test facility; no torch).

With ``HPC_TRAIN_FORK_SERVER`` set to the socket of a running fork server
(``python -m hpc_train.compute.runtime.fork_server SOCKET``, which has imported torch and the rank's modules
once), the local launcher asks it for each rank instead of starting a fresh Python: the server forks, and the
child takes the rank's command line, environment, folder, umask, signal dispositions and file descriptors before
it runs the rank's module as ``python -m`` would. The server says no (and the launcher starts a fresh process)
whenever the child could not be the same as a fresh process: another Python, a command that is not
``-m MODULE``, an environment that differs from the server's in a variable read when a library loads, a thread
already running in the server (see the server's module for the list).

One connection per rank carries the request (a JSON line, the file descriptors beside it), then the server's
answers (the pid, later the exit status) and the launcher's signals to forward. Unlike a fresh process, a warm
rank is the server's child, in the server's process group, with the server's hash seed: tests about signals to
process groups, kills, hangs, ``/proc`` or thread settings start fresh ranks.
"""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import subprocess
import time
from typing import Dict, List, Optional, Sequence, Union

FORK_SERVER_VARIABLE = "HPC_TRAIN_FORK_SERVER"  # the fork server's socket; unset: every rank a fresh process
START, SIGNAL, STATS = "start", "signal", "stats"  # what the launcher (or a test) asks
PID, EXIT, DECLINED = "pid", "exit", "declined"  # what the server answers
MAX_FDS = 16
ANSWER_TIMEOUT_S = 30.0


class ForkServerLost(Exception):
    """The fork server's connection ended before it told a rank's exit status (the server died)."""


def send(conn: socket.socket, message: Dict, fds: Sequence[int] = ()) -> None:
    data = (json.dumps(message) + "\n").encode()
    if fds:
        socket.send_fds(conn, [data], list(fds))
    else:
        conn.sendall(data)


class Lines:
    """The JSON lines arriving on a connection, one message each."""

    def __init__(self, conn: socket.socket) -> None:
        self.conn = conn
        self.buffer = b""
        self.closed = False

    def read(self, timeout: Optional[float]) -> List[Dict]:
        """The messages complete now, after waiting up to `timeout` s for data (None: until some arrive)."""
        if not self.closed and select.select([self.conn], [], [], timeout)[0]:
            data = self.conn.recv(65536)
            self.closed = not data
            self.buffer += data
        *complete, self.buffer = self.buffer.split(b"\n")
        return [json.loads(line) for line in complete if line]


class WarmRank:
    """A rank the fork server started, with the face of subprocess.Popen the local launcher uses."""

    def __init__(self, conn: socket.socket, lines: Lines, pid: int) -> None:
        self.conn, self.lines, self.pid = conn, lines, pid
        self.returncode: Optional[int] = None

    def _take(self, timeout: Optional[float]) -> None:
        for message in self.lines.read(timeout):
            if EXIT in message:
                self.returncode = int(message[EXIT])
        if self.returncode is None and self.lines.closed:
            raise ForkServerLost(f"the fork server stopped while rank pid {self.pid} ran")
        if self.returncode is not None:
            self.conn.close()

    def poll(self) -> Optional[int]:
        if self.returncode is None:
            self._take(0)
        return self.returncode

    def wait(self, timeout: Optional[float] = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.returncode is None:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise subprocess.TimeoutExpired(f"rank pid {self.pid}", timeout or 0)
            self._take(left)
        return self.returncode

    def send_signal(self, signum: int) -> None:
        """Sent by the server, which knows whether its child still runs (no pid reused by another process)."""
        if self.poll() is None:
            send(self.conn, {SIGNAL: int(signum)})

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def _dispositions() -> Dict[str, List[int]]:
    """What a fresh process would inherit: the signals ignored here (kept ignored across exec) and the mask."""
    ignored = [int(s) for s in signal.valid_signals() if _ignored(s)]
    blocked = [int(s) for s in signal.pthread_sigmask(signal.SIG_BLOCK, [])]
    return {"ignored": ignored, "blocked": blocked}


def _ignored(signum: int) -> bool:
    try:
        return signal.getsignal(signum) == signal.SIG_IGN
    except (OSError, ValueError):
        return False


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def start_warm(
    server: str, command: List[str], env: Dict[str, str], fds: Dict[int, int], cwd: Optional[str] = None
) -> Optional[WarmRank]:
    """Ask the fork server at `server` to start `command`; `fds` maps each descriptor number the rank gets (0, 1, 2
    and any passed on) to the launcher's descriptor it is a copy of. None: the server said no, or is not there."""
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.connect(server)
        request = {
            START: command,
            "env": env,
            "cwd": cwd or os.getcwd(),
            "umask": _umask(),
            "fds": list(fds),
            **_dispositions(),
        }
        send(conn, request, list(fds.values()))
        lines = Lines(conn)
        answer = _first_answer(lines)
    except OSError:
        conn.close()
        return None
    if PID not in answer:
        conn.close()
        return None
    return WarmRank(conn, lines, int(answer[PID]))


def _first_answer(lines: Lines) -> Dict:
    deadline = time.monotonic() + ANSWER_TIMEOUT_S
    while time.monotonic() < deadline and not lines.closed:
        answers = lines.read(max(0.0, deadline - time.monotonic()))
        if answers:
            return answers[0]
    return {DECLINED: "no answer"}


def start_rank(
    command: List[str], env: Dict[str, str], out: Optional[object], pass_fds: Sequence[int] = ()
) -> Union[subprocess.Popen, WarmRank]:
    """One rank: warm from the fork server when ``HPC_TRAIN_FORK_SERVER`` names one that says yes, else a fresh
    process. `out`: the open file for the rank's stdout and stderr (None: the launcher's own)."""
    server = os.environ.get(FORK_SERVER_VARIABLE)
    if server:
        fd = out.fileno() if out is not None else None  # type: ignore[attr-defined]
        fds = {0: 0, 1: 1 if fd is None else fd, 2: 2 if fd is None else fd, **{n: n for n in pass_fds}}
        warm = start_warm(server, command, env, fds)
        if warm is not None:
            return warm
    stderr = subprocess.STDOUT if out is not None else None
    return subprocess.Popen(command, env=env, stdout=out, stderr=stderr, pass_fds=tuple(pass_fds))  # type: ignore


def stats(server: str) -> Dict:
    """The server's counts: ranks forked, and each request it said no to, with why."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.connect(server)
        send(conn, {STATS: True})
        return _first_answer(Lines(conn))
