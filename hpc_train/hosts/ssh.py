"""The user's own OpenSSH client, multiplexed: one control master per destination, every command a session on it.

Decision: the ``ssh`` the user already has, not a Python SSH library. It reads the user's ``~/.ssh/config``
(aliases, ProxyJump, IdentityFile, the site's options), talks to their agent, and a two-factor prompt is answered
once in a terminal when the master opens (``hpc-train-connect``); later commands, the Python API and the notebook
are sessions on that master and ask nothing. hpc_train stores no password and no key.

Every ssh starts in a session of its own, so the terminal's Ctrl-C reaches hpc_train only, which passes it on to
the cluster as Ctrl-C (and a master outlives the command that opened it). Every command this module builds runs
with ``BatchMode=yes`` (never a prompt from a notebook or a background process) and ``StrictHostKeyChecking=yes``
(an unknown host key is refused, whatever the user's config says; only the interactive ``open_master`` asks, in the
terminal). ssh's own failures (exit status 255) become an :class:`SshError` whose ``kind`` says which: the host
key, the authentication, the host unreachable, the connection dropped; it is hpc_train's ``Unreachable``, its
message saying each with the one thing to do.
"""

from __future__ import annotations

import hashlib
import os
import re
import shlex
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional, Sequence, Tuple

from hpc_train.errors import Unreachable

SSH_FAILED = 255  # ssh's exit status for its own failure (the remote command's status otherwise)
CONNECT_TIMEOUT_S = 20
AUTO_PERSIST = "15m"  # a master opened by a command without a terminal outlives it this long when idle
SOCKET_DIR = Path("~/.cache/hpc_train/ssh")  # control sockets, mode 0700 (a socket path must stay under ~100 bytes)
LOGIN_KEY = "cluster.login"  # the setting that names the destination: every refusal of this module names it

# ssh's words for each failure (OpenSSH 7 to 9), first match wins.
KINDS: Tuple[Tuple[str, Tuple[str, ...]], ...] = (
    ("host_key_changed", ("REMOTE HOST IDENTIFICATION HAS CHANGED", "Host key for", "has changed")),
    ("host_key_unknown", ("Host key verification failed", "No ED25519 host key is known", "host key is known for")),
    ("auth_refused", ("Permission denied", "Too many authentication failures", "no matching host key type")),
    (
        "unreachable",
        (
            "Could not resolve hostname",
            "Connection refused",
            "Connection timed out",
            "No route to host",
            "Network is unreachable",
            "Operation timed out",
            "Name or service not known",
            "nodename nor servname",
            "proxy dialog",
        ),
    ),
    (
        "dropped",
        (
            "Connection closed by",
            "Connection reset",
            "Broken pipe",
            "Control socket connect",
            "mux_client",
            "Timeout, server",
            "closed by remote host",
        ),
    ),
)
_URI = re.compile(r"ssh://(?:(?P<user>[^@/]+)@)?(?P<host>[^:/]+)(?::(?P<port>[0-9]+))?/?")


class SshError(Unreachable):
    """ssh itself failed (not the remote command): ``kind`` is one of KINDS' names or ``other``; ``said`` its line.

    An :class:`~hpc_train.errors.Unreachable` naming ``cluster.login``: what went wrong and the one thing to do;
    ``connect`` is the command that opens the connection in a terminal (hpc-train-connect with the cluster's words;
    ``ssh LOGIN`` when not given)."""

    def __init__(self, login: str, kind: str, said: str, connect: str = "") -> None:
        self.login, self.kind, self.said = login, kind, said
        super().__init__(LOGIN_KEY, *_problem_and_fix(login, kind, f"(ssh said: {said})", connect or f"ssh {login}"))

    @property
    def line(self) -> str:
        """ssh's failure in one line, as a failed process's stderr says it (``ssh LOGIN: WORDS``)."""
        return f"ssh {self.login}: {self.said}"


def ssh_failure(login: str, code: int, stderr: str) -> Optional[SshError]:
    """ssh's own failure, told by its exit status and its words; None when the remote command ran (whatever its
    status) or ssh said nothing it is known to say."""
    if code == SSH_FAILED and kind_of(stderr) != "other":
        return SshError(login, kind_of(stderr), said_line(stderr))
    return None


def unreachable(err: SshError, connect: str) -> SshError:
    """``err`` with ``connect`` (the command that opens the connection in a terminal) in its fix."""
    return SshError(err.login, err.kind, err.said, connect)


def _problem_and_fix(login: str, kind: str, said: str, connect: str) -> Tuple[str, str]:
    if kind == "host_key_unknown":
        problem = (
            f"the host key of {login} is not known to this machine {said}; hpc_train never accepts a host key on its"
            " own."
        )
        fix = (
            "check the key's fingerprint against your site's documentation, then connect once in a terminal and"
            f" answer yes: {connect} (or ssh {login})."
        )
    elif kind == "host_key_changed":
        problem = f"the host key of {login} has CHANGED since you last connected {said}."
        fix = (
            "ask your site whether its key changed; if it did, remove the old one (ssh-keygen -R HOST) and connect"
            f" once in a terminal: {connect}."
        )
    elif kind == "auth_refused":
        problem = (
            f"{login} refused the login {said}; hpc_train asks for nothing itself (no password, no second factor"
            " outside a terminal)."
        )
        fix = (
            "load your key into your agent (ssh-add) or name it in ~/.ssh/config (IdentityFile); on a site that asks"
            f" for a password or a second factor, open the connection once in a terminal: {connect} (later commands,"
            " the Python API and notebooks reuse it)."
        )
    elif kind == "unreachable":
        problem = f"{login} cannot be reached {said}."
        fix = f"check the host name and port (ssh -v {login}), your VPN, or the ProxyJump of your ~/.ssh/config."
    elif kind == "dropped":
        problem = f"the connection to {login} dropped {said}."
        fix = f"run the command again (a new connection opens; on a two-factor site: {connect} first)."
    else:
        problem, fix = f"ssh to {login} failed {said}.", f"try ssh -v {login}; then {connect}."
    return problem, fix


def kind_of(stderr: str) -> str:
    """Which failure ssh's stderr tells of (``other`` when none is recognised)."""
    for kind, words in KINDS:
        if any(word in stderr for word in words):
            return kind
    return "other"


def said_line(stderr: str) -> str:
    """ssh's most telling line: the last that names its failure, else the last line (or that it said nothing)."""
    lines = [line.strip(" @\r") for line in stderr.splitlines() if line.strip(" @\r") and not line.startswith("debug")]
    kind = kind_of(stderr)
    for line in reversed(lines):
        if kind != "other" and kind_of(line) == kind:
            return line
    return lines[-1] if lines else "ssh exited without a word"


@dataclass(frozen=True)
class SshTarget:
    """One destination as the user wrote it (``user@host``, ``ssh://user@host:port`` or a ``~/.ssh/config`` alias)."""

    login: str

    def __post_init__(self) -> None:
        if not self.login or self.login.startswith("-") or any(c.isspace() for c in self.login):
            raise ValueError(f"not an SSH destination: {self.login!r}")

    def host_and_port(self) -> Tuple[str, Optional[str]]:
        """``[user@]host`` and the port of a ``ssh://`` URI (rsync takes no URI); the login as is otherwise."""
        found = _URI.fullmatch(self.login)
        if not found:
            return self.login, None
        host = f"{found['user']}@{found['host']}" if found["user"] else found["host"]
        return host, found["port"]

    def socket(self) -> Path:
        """The control socket: one per destination as written, its name a hash (a socket path must stay short)."""
        folder = SOCKET_DIR.expanduser()
        folder.mkdir(parents=True, exist_ok=True)
        os.chmod(folder, 0o700)
        return folder / hashlib.sha1(self.login.encode()).hexdigest()[:20]

    def options(self, batch: bool = True) -> List[str]:
        """What every ssh of this target is given: the control socket, timeouts, and no prompt unless ``batch`` is
        False (only ``open_master`` in a terminal)."""
        host, port = self.host_and_port()
        words = [
            "-o", f"ControlPath={self.socket()}",
            "-o", f"ConnectTimeout={CONNECT_TIMEOUT_S}",
            "-o", "ServerAliveInterval=15",
            "-o", "ServerAliveCountMax=4",
        ]  # fmt: skip
        if batch:
            words += ["-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes"]
        else:
            words += ["-o", "StrictHostKeyChecking=ask"]
        return words + (["-p", port] if port else [])

    def destination(self) -> str:
        return self.host_and_port()[0]

    def command(self, remote: str, tty: bool = False) -> List[str]:
        """``ssh ... DEST -- REMOTE`` as a session on the master (a direct connection when none is open)."""
        return ["ssh", *self.options(), "-o", "ControlMaster=no", "-tt" if tty else "-T", self.destination(), remote]

    def rsync_shell(self) -> str:
        """rsync's ``-e``: the same ssh, on the same master."""
        return shlex.join(["ssh", *self.options(), "-o", "ControlMaster=no"])

    def master_alive(self) -> bool:
        done = subprocess.run(
            ["ssh", *self.options(), "-O", "check", self.destination()], capture_output=True, text=True, check=False
        )
        return done.returncode == 0

    def open_master(self, interactive: bool = False, persist: str = AUTO_PERSIST) -> None:
        """Open the control master in the background (it stays ``persist`` after its last session); raise SshError.

        interactive: in the user's terminal, which answers any prompt (a password, a second factor, a new host
        key); otherwise no prompt, and ssh's words are read from a file, never a pipe the background master would
        hold open.
        """
        # A master that died (killed, a laptop that slept) leaves its socket behind, and a new master that finds it
        # disables multiplexing silently: the socket goes first.
        self.socket().unlink(missing_ok=True)
        command = ["ssh", *self.options(batch=not interactive), "-M", "-N", "-f", "-o", f"ControlPersist={persist}"]
        command.append(self.destination())
        if interactive:
            done = subprocess.run(command, check=False)
            if done.returncode != 0:
                raise SshError(self.login, "other", f"ssh exited with status {done.returncode}")
            return
        with tempfile.TemporaryFile(mode="w+") as words:
            done = subprocess.run(
                command, stdin=subprocess.DEVNULL, stdout=words, stderr=words, check=False, start_new_session=True
            )
            words.seek(0)
            text = words.read()
        if done.returncode != 0:
            raise SshError(self.login, kind_of(text), said_line(text))

    def close_master(self) -> bool:
        done = subprocess.run(
            ["ssh", *self.options(), "-O", "exit", self.destination()], capture_output=True, text=True, check=False
        )
        return done.returncode == 0


def remote_line(setup: Sequence[str], words: Sequence[str], env: Optional[dict] = None, cwd: str = "") -> str:
    """One line for the remote shell: the setup lines (their output to stderr, so stdout stays the command's), then
    ``exec`` the command, with ``env`` set and in ``cwd``."""
    parts = [f"{{ {'; '.join(setup)}; }} >&2 </dev/null" if setup else ""]
    if cwd:
        parts.append(f"cd {shlex.quote(cwd)}")
    assign = [f"{name}={value}" for name, value in (env or {}).items()]
    parts.append("exec " + shlex.join(["env", *assign, *words] if assign else list(words)))
    return " && ".join(part for part in parts if part)
