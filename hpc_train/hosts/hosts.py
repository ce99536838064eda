"""Where Slurm's commands run: this machine (nothing set) or a cluster reached over SSH; the one switch.

``slurm_cli.run`` asks ``current()``; a laptop's command that follows a cluster's jobs (a report, ``Job.wait()``)
runs its Slurm calls inside ``commands_on(SshHost(...))``. Nothing else compares where it is.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import subprocess
from typing import Dict, Iterator, Mapping, Optional, Protocol, Sequence

from hpc_train.hosts.ssh import SSH_FAILED, SshError, SshTarget, kind_of, remote_line, said_line


class CommandHost(Protocol):
    """Somewhere other than this machine that runs Slurm's commands: ``run`` as slurm_cli.run returns."""

    def run(
        self, args: Sequence[str], timeout: float, env: Optional[Mapping[str, str]] = None
    ) -> subprocess.CompletedProcess: ...


class SshHost:
    """A cluster's login node: each command one session on the control master, after the profile's setup lines."""

    def __init__(self, login: str, setup: Sequence[str] = ()) -> None:
        self.target = SshTarget(login)
        self.setup = list(setup)

    def run(
        self, args: Sequence[str], timeout: float, env: Optional[Mapping[str, str]] = None
    ) -> subprocess.CompletedProcess:
        """The command's finished process as slurm_cli.run returns it; ssh's own failure is exit 255 with its words."""
        changed: Dict[str, str] = {k: v for k, v in (env or {}).items() if os.environ.get(k) != v}
        command = self.target.command(remote_line(self.setup, [str(a) for a in args], changed))
        try:
            done = subprocess.run(
                command, capture_output=True, text=True, timeout=timeout + 15, check=False, start_new_session=True
            )
        except subprocess.TimeoutExpired:
            return subprocess.CompletedProcess(list(args), 124, "", f"{args[0]} on {self.target.login} did not answer")
        if done.returncode == SSH_FAILED and kind_of(done.stderr) != "other":
            return subprocess.CompletedProcess(
                list(args), SSH_FAILED, "", f"ssh {self.target.login}: {said_line(done.stderr)}"
            )
        return subprocess.CompletedProcess(list(args), done.returncode, done.stdout, done.stderr)


class Unconnected:
    """A cluster no connection is open to (a laptop's dry run): no command runs, each says why (exit 127)."""

    def __init__(self, login: str) -> None:
        self.login = login

    def run(
        self, args: Sequence[str], timeout: float, env: Optional[Mapping[str, str]] = None
    ) -> subprocess.CompletedProcess:
        return subprocess.CompletedProcess(list(args), 127, "", f"{args[0]}: no connection to {self.login} is open")


_CURRENT: contextvars.ContextVar[Optional[CommandHost]] = contextvars.ContextVar("hpc_train_command_host", default=None)


def current() -> Optional[CommandHost]:
    """The cluster Slurm's commands go to now; None: this machine."""
    return _CURRENT.get()


@contextlib.contextmanager
def commands_on(host: Optional[CommandHost]) -> Iterator[None]:
    """Slurm's commands inside the block run on ``host`` (None: here)."""
    token = _CURRENT.set(host)
    try:
        yield
    finally:
        _CURRENT.reset(token)


def use(host: Optional[CommandHost]) -> None:
    """For the rest of this process (a laptop's one-shot command), Slurm's commands run on ``host``."""
    _CURRENT.set(host)


__all__ = ["CommandHost", "SshError", "SshHost", "Unconnected", "commands_on", "current", "use"]
