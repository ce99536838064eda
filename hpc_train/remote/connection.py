"""One cluster, reached over the user's multiplexed ssh: opened once per process, the two hpc_train versions
compared, the project folder made; every failure one ConfigError naming ``cluster.login`` (or the key at fault) and
the fix."""

from __future__ import annotations

import json
import shlex
import subprocess
from dataclasses import dataclass
from importlib import metadata
from typing import Dict, List, Optional, Sequence

from hpc_train.config.errors import ConfigError
from hpc_train.hosts.hosts import SshHost
from hpc_train.hosts.ssh import SSH_FAILED, SshError, SshTarget, kind_of, remote_line, said_line
from hpc_train.remote.settings import RemoteSettings

PACKAGE = "hpc-train"
SERVE = "hpc_train.remote.serve"
# Asked first, in one round trip, by the cluster's Python itself (it must work with any hpc_train there, or none).
HELLO = (
    "import json, os, shutil, sys\n"
    "try:\n    from importlib.metadata import version; v = version('hpc-train')\n"
    "except Exception:\n    v = None\n"
    "d = os.path.abspath(os.path.expanduser(sys.argv[1])); e = None\n"
    "try:\n    os.makedirs(d, exist_ok=True)\nexcept OSError as x:\n    e = str(x)\n"
    "print(json.dumps({'version': v, 'home': os.path.expanduser('~'), 'dir': d, 'dir_error': e,"
    " 'rsync': bool(shutil.which('rsync')), 'python': sys.executable}))\n"
)


def local_version() -> str:
    return metadata.version(PACKAGE)


@dataclass(frozen=True)
class Cluster:
    """What the cluster side said when the connection opened."""

    version: str
    home: str
    project: str  # the synced project's folder there, absolute
    rsync: bool
    python: str


def refusal(settings: RemoteSettings, err: SshError) -> ConfigError:
    """ssh's failure said as hpc_train's refusal: what went wrong and the one thing to do."""
    login, connect = settings.login or "", settings.connect_command()
    said = f"(ssh said: {err.said})"
    if err.kind == "host_key_unknown":
        return ConfigError(
            "cluster.login",
            f"the host key of {login} is not known to this machine {said}; hpc_train never accepts a host key"
            " on its own.",
            f"check the key's fingerprint against your site's documentation, then connect once in a terminal and"
            f" answer yes: {connect} (or ssh {login}).",
        )
    if err.kind == "host_key_changed":
        return ConfigError(
            "cluster.login",
            f"the host key of {login} has CHANGED since you last connected {said}.",
            f"ask your site whether its key changed; if it did, remove the old one (ssh-keygen -R HOST) and connect"
            f" once in a terminal: {connect}.",
        )
    if err.kind == "auth_refused":
        return ConfigError(
            "cluster.login",
            f"{login} refused the login {said}; hpc_train asks for nothing itself (no password, no second factor"
            " outside a terminal).",
            f"load your key into your agent (ssh-add) or name it in ~/.ssh/config (IdentityFile); on a site that asks"
            f" for a password or a second factor, open the connection once in a terminal: {connect} (later commands,"
            " the Python API and notebooks reuse it).",
        )
    if err.kind == "unreachable":
        return ConfigError(
            "cluster.login",
            f"{login} cannot be reached {said}.",
            "check the host name and port (ssh -v " + login + "), your VPN, or the ProxyJump of your ~/.ssh/config.",
        )
    if err.kind == "dropped":
        return ConfigError(
            "cluster.login",
            f"the connection to {login} dropped {said}.",
            f"run the command again (a new connection opens; on a two-factor site: {connect} first).",
        )
    return ConfigError("cluster.login", f"ssh to {login} failed {said}.", f"try ssh -v {login}; then {connect}.")


class Connection:
    """The cluster of ``settings``: ``open()`` once, then commands and ``serve`` actions as sessions on the master."""

    _opened: Dict[str, Cluster] = {}  # per process: one hello per login

    def __init__(self, settings: RemoteSettings) -> None:
        assert settings.login is not None
        self.settings = settings
        self.target = SshTarget(settings.login)
        self.cluster: Optional[Cluster] = None

    def host(self) -> SshHost:
        """Where Slurm's commands go for this cluster (hpc_train.hosts.hosts.commands_on)."""
        return SshHost(self.target.login, self.settings.setup)

    def open(self, project: str = "~") -> Cluster:
        """The master opened (or reused), hpc_train's version on the cluster compared with ours, ``project`` made."""
        key = f"{self.target.login}|{self.settings.python}|{project}"
        if key in self._opened:
            self.cluster = self._opened[key]
            return self.cluster
        try:
            if not self.target.master_alive():
                self.target.open_master()
        except SshError as err:
            raise refusal(self.settings, err) from None
        done = self.run([self.settings.python, "-c", HELLO, project])
        said = done.stdout.decode(errors="replace").strip().splitlines()
        if done.returncode != 0 or not said:
            words = done.stderr.decode(errors="replace").strip() or f"exit status {done.returncode}"
            raise ConfigError(
                "cluster.remote_python",
                f"`{self.settings.python}` on {self.target.login} did not run ({words.splitlines()[-1]}).",
                "set cluster.remote_python to the cluster's Python that has hpc_train and torch (a full path, e.g."
                " ~/venvs/train/bin/python), or give cluster.setup the lines that provide it (module load ...).",
            )
        found = json.loads(said[-1])
        ours = local_version()
        if found["version"] != ours:
            have = f"hpc_train {found['version']}" if found["version"] else "no hpc_train"
            raise ConfigError(
                "cluster.remote_python",
                f"the cluster's Python ({found['python']} on {self.target.login}) has {have}; this machine has"
                f" hpc_train {ours}, and both sides must run the same version.",
                f"install it once on the cluster: ssh {self.target.login} {shlex.quote(self.settings.python)} -m pip"
                f" install --user {PACKAGE}=={ours} (or set cluster.remote_python to a Python that has it).",
            )
        if found["dir_error"]:
            raise ConfigError(
                "cluster.remote_dir",
                f"{found['dir']} cannot be made on {self.target.login}: {found['dir_error']}.",
                "set cluster.remote_dir to a folder of yours on the cluster.",
            )
        self.cluster = Cluster(found["version"], found["home"], found["dir"], bool(found["rsync"]), found["python"])
        self._opened[key] = self.cluster
        return self.cluster

    def run(
        self,
        words: Sequence[str],
        stdin: Optional[bytes] = None,
        cwd: str = "",
        timeout: Optional[float] = None,
    ) -> "subprocess.CompletedProcess[bytes]":
        """One command on the cluster, after the profile's setup lines; ssh's own failure raises ConfigError."""
        command = self.target.command(remote_line(self.settings.setup, words, cwd=cwd))
        try:
            done = subprocess.run(
                command, input=stdin, capture_output=True, timeout=timeout, check=False, start_new_session=True
            )
        except subprocess.TimeoutExpired:
            raise ConfigError(
                "cluster.login", f"{self.target.login} did not answer within {timeout:g} s.", "run it again."
            ) from None
        self.check_ssh(done.returncode, done.stderr.decode(errors="replace"))
        return done

    def check_ssh(self, code: int, stderr: str) -> None:
        if code == SSH_FAILED and kind_of(stderr) != "other":
            raise refusal(self.settings, SshError(self.target.login, kind_of(stderr), said_line(stderr)))

    def serve_words(self, action: str, *words: str) -> List[str]:
        return [self.settings.python, "-m", SERVE, action, *words]

    def serve(
        self, action: str, *words: str, stdin: Optional[bytes] = None, cwd: str = ""
    ) -> "subprocess.CompletedProcess[bytes]":
        return self.run(self.serve_words(action, *words), stdin=stdin, cwd=cwd)

    def serve_json(self, action: str, *words: str, stdin: Optional[object] = None, cwd: str = "") -> Dict:
        data = None if stdin is None else json.dumps(stdin).encode()
        done = self.serve(action, *words, stdin=data, cwd=cwd)
        if done.returncode != 0:
            words_said = done.stderr.decode(errors="replace").strip()
            raise ConfigError(
                "cluster.remote_python",
                f"hpc_train on {self.target.login} failed to {action}: {words_said or done.returncode}.",
                "run the command again; if it fails again, run it on the cluster itself.",
            )
        return json.loads(done.stdout.decode().strip().splitlines()[-1])

    def popen(self, words: Sequence[str], **kwargs) -> subprocess.Popen:
        """A command on the cluster whose output is read as it comes (``stdout=PIPE`` etc. in kwargs)."""
        command = self.target.command(remote_line(self.settings.setup, words))
        return subprocess.Popen(command, start_new_session=True, **kwargs)


def remote_path(cluster: Cluster, path: str) -> str:
    """``~`` expanded to the cluster's home."""
    return cluster.home + path[1:] if path == "~" or path.startswith("~/") else path
