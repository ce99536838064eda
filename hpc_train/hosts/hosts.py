"""Where commands run: this machine (``LocalHost``) or a cluster's login node over SSH (``SshHost``), behind one
interface (``Host``, after NeMo-Run's ``Tunnel``), and the one switch that says where Slurm's commands go.

``Host.run`` runs a command to its end; ``Host.popen`` starts one whose output is read as it comes, and
``Host.check`` reads how that one ended as ``run`` would. A host that cannot be reached (ssh's own failure, or no
answer in time) is handled as the caller chooses (``failure``): RAISE raises ``hpc_train.errors.Unreachable`` with
the fix (a laptop's commands: connect, sync, forward, fetch); RETURN gives a failed process whose stderr says why
(Slurm's commands, whose callers read any failure as no answer): exit 255 when ssh failed, 124 when nothing answered
in time, 127 when the command is not there. The command's own exit status is always returned, for the caller to read.

``slurm_cli.run`` asks ``current()``; a laptop's command that follows a cluster's jobs (a report, ``Job.wait()``)
runs its Slurm calls inside ``commands_on(SshHost(...))``. Nothing else compares where it is.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import shutil
import subprocess
from typing import Any, Iterator, Mapping, Optional, Protocol, Sequence, Union

from hpc_train.errors import Unreachable
from hpc_train.hosts.ssh import (
    AUTO_PERSIST,
    LOGIN_KEY,
    SSH_FAILED,
    SshError,
    SshTarget,
    remote_line,
    ssh_failure,
    unreachable,
)

RAISE = "raise"  # a host that cannot be reached raises Unreachable
RETURN = "return"  # ... is a failed process (255: ssh failed, 124: no answer in time, 127: no such command)
SSH_SLACK_S = 15  # ssh's own time on top of a command's timeout: a session on the master, the setup lines
Input = Union[bytes, str, None]


class Host(Protocol):
    """Somewhere commands run. ``env`` is the command's whole environment as this process would give it (None:
    this process's own); ``text``: str in and out, else bytes; ``failure``: RAISE or RETURN (the module's words)."""

    name: str  # in messages: the destination, or "this machine"

    def run(
        self,
        words: Sequence[str],
        timeout: Optional[float] = None,
        env: Optional[Mapping[str, str]] = None,
        *,
        stdin: Input = None,
        cwd: str = "",
        text: bool = False,
        failure: str = RAISE,
    ) -> subprocess.CompletedProcess: ...

    def popen(self, words: Sequence[str], cwd: str = "", **kwargs: Any) -> subprocess.Popen: ...

    def check(self, code: int, stderr: str) -> None: ...


def _failed(args: Sequence[str], code: int, said: str, text: bool) -> subprocess.CompletedProcess:
    """A command that did not run (or not to its end), as a finished process whose stderr says why."""
    return subprocess.CompletedProcess(list(args), code, "" if text else b"", said if text else said.encode())


class LocalHost:
    """This machine: the command runs as a child of this process."""

    name = "this machine"

    def run(
        self,
        words: Sequence[str],
        timeout: Optional[float] = None,
        env: Optional[Mapping[str, str]] = None,
        *,
        stdin: Input = None,
        cwd: str = "",
        text: bool = False,
        failure: str = RAISE,
    ) -> subprocess.CompletedProcess:
        """The command, finished; RAISE lets subprocess's own errors through (a missing command, a timeout)."""
        args = [str(word) for word in words]
        if failure == RETURN and shutil.which(args[0]) is None:  # said without starting anything
            return _failed(args, 127, f"{args[0]}: command not found", text)
        try:
            return subprocess.run(
                args,
                input=stdin,
                capture_output=True,
                text=text,
                timeout=timeout,
                cwd=cwd or None,
                env=env,
                check=False,
            )
        except subprocess.TimeoutExpired:
            if failure == RAISE:
                raise
            return _failed(args, 124, f"{args[0]} did not answer within {timeout:g} s", text)
        except OSError as err:
            if failure == RAISE:
                raise
            return _failed(args, 126, f"{args[0]}: {err}", text)

    def popen(self, words: Sequence[str], cwd: str = "", **kwargs: Any) -> subprocess.Popen:
        return subprocess.Popen([str(word) for word in words], cwd=cwd or None, **kwargs)

    def check(self, code: int, stderr: str) -> None:
        """Nothing to reach here: the command's own status is the caller's."""


class SshHost:
    """A cluster's login node: each command one session on the control master, after the profile's setup lines.
    ``connect_command``: what opens the connection in a terminal, named in a refusal's fix."""

    def __init__(self, login: str, setup: Sequence[str] = (), connect_command: str = "") -> None:
        self.target = SshTarget(login)
        self.name = login
        self.setup = list(setup)
        self.connect_command = connect_command or f"ssh {login}"

    def open(self, interactive: bool = False, persist: str = AUTO_PERSIST) -> None:
        """The control master open: the one there, or a new one (SshTarget.open_master); Unreachable otherwise."""
        try:
            if not self.target.master_alive():
                self.target.open_master(interactive=interactive, persist=persist)
        except SshError as err:
            raise unreachable(err, self.connect_command) from None

    def run(
        self,
        words: Sequence[str],
        timeout: Optional[float] = None,
        env: Optional[Mapping[str, str]] = None,
        *,
        stdin: Input = None,
        cwd: str = "",
        text: bool = False,
        failure: str = RAISE,
    ) -> subprocess.CompletedProcess:
        """The command run there, finished; only the variables of ``env`` that differ from this process's are set."""
        args = [str(word) for word in words]
        changed = {key: value for key, value in (env or {}).items() if os.environ.get(key) != value}
        command = self.target.command(remote_line(self.setup, args, changed, cwd))
        limit = None if timeout is None else timeout + SSH_SLACK_S
        try:
            done = subprocess.run(
                command, input=stdin, capture_output=True, text=text, timeout=limit, check=False, start_new_session=True
            )
        except subprocess.TimeoutExpired:
            said = f"{args[0]} on {self.name} did not answer within {timeout:g} s"
            if failure == RAISE:
                raise Unreachable(LOGIN_KEY, f"{said}.", "run the command again.") from None
            return _failed(args, 124, said, text)
        err = ssh_failure(self.name, done.returncode, done.stderr if text else done.stderr.decode(errors="replace"))
        if err is not None and failure == RAISE:
            raise unreachable(err, self.connect_command)
        if err is not None:
            return _failed(args, SSH_FAILED, err.line, text)
        return subprocess.CompletedProcess(args, done.returncode, done.stdout, done.stderr)

    def popen(self, words: Sequence[str], cwd: str = "", **kwargs: Any) -> subprocess.Popen:
        """The command started there, its output read as it comes (``stdout=PIPE`` etc. in kwargs)."""
        command = self.target.command(remote_line(self.setup, [str(word) for word in words], cwd=cwd))
        return subprocess.Popen(command, start_new_session=True, **kwargs)

    def check(self, code: int, stderr: str) -> None:
        """How a started command ended, read as ``run`` reads it: ssh's own failure raises Unreachable."""
        err = ssh_failure(self.name, code, stderr)
        if err is not None:
            raise unreachable(err, self.connect_command)


class Unconnected:
    """A cluster no connection is open to (a laptop's dry run): no command runs, each says why (exit 127)."""

    def __init__(self, login: str) -> None:
        self.name = login

    def run(
        self,
        words: Sequence[str],
        timeout: Optional[float] = None,
        env: Optional[Mapping[str, str]] = None,
        *,
        stdin: Input = None,
        cwd: str = "",
        text: bool = False,
        failure: str = RAISE,
    ) -> subprocess.CompletedProcess:
        said = f"{words[0]}: no connection to {self.name} is open"
        if failure == RAISE:
            raise Unreachable(LOGIN_KEY, f"{said}.", "open one: hpc-train-connect with the cluster's words.")
        return _failed(list(words), 127, said, text)

    def popen(self, words: Sequence[str], cwd: str = "", **kwargs: Any) -> subprocess.Popen:
        raise Unreachable(LOGIN_KEY, f"no connection to {self.name} is open.", "open one: hpc-train-connect.")

    def check(self, code: int, stderr: str) -> None:
        """Nothing ran."""


LOCAL = LocalHost()
_CURRENT: contextvars.ContextVar[Optional[Host]] = contextvars.ContextVar("hpc_train_command_host", default=None)


def current() -> Optional[Host]:
    """The cluster Slurm's commands go to now; None: this machine."""
    return _CURRENT.get()


@contextlib.contextmanager
def commands_on(host: Optional[Host]) -> Iterator[None]:
    """Slurm's commands inside the block run on ``host`` (None: here)."""
    token = _CURRENT.set(host)
    try:
        yield
    finally:
        _CURRENT.reset(token)


def use(host: Optional[Host]) -> None:
    """For the rest of this process (a laptop's one-shot command), Slurm's commands run on ``host``."""
    _CURRENT.set(host)


__all__ = [
    "LOCAL",
    "RAISE",
    "RETURN",
    "Host",
    "LocalHost",
    "SshError",
    "SshHost",
    "Unconnected",
    "commands_on",
    "current",
    "use",
]
