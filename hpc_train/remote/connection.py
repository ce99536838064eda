"""One cluster, reached over the user's multiplexed ssh (hpc_train.hosts.hosts.SshHost): opened once per connection,
the two hpc_train versions compared, the project folder made. A cluster that cannot be reached (or a connection that
ended mid-command) raises ``Unreachable`` naming ``cluster.login``; what the cluster's side refuses, one ConfigError
naming the key at fault; each with the fix."""

from __future__ import annotations

import json
import shlex
import subprocess
from dataclasses import dataclass
from importlib import metadata
from typing import Dict, List, Optional

from hpc_train.config.errors import ConfigError
from hpc_train.errors import HpcTrainError, Unreachable
from hpc_train.hosts.hosts import SshHost
from hpc_train.hosts.ssh import LOGIN_KEY, SSH_FAILED
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


class Connection:
    """The cluster of ``settings``: ``open()`` once, then commands (``host``) and ``serve`` actions as sessions on the
    master. What the cluster said is this connection's (``cluster``); another connection asks again."""

    def __init__(self, settings: RemoteSettings) -> None:
        assert settings.login is not None
        self.settings = settings
        self.host = SshHost(settings.login, settings.setup, settings.connect_command())
        self.target = self.host.target
        self.cluster: Optional[Cluster] = None

    def open(self, project: str = "~") -> Cluster:
        """The master opened (or reused), hpc_train's version on the cluster compared with ours, ``project`` made."""
        self.host.open()
        done = self.host.run([self.settings.python, "-c", HELLO, project])
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
        return self.cluster

    def ended(self, code: int, said: str, key: str, what: str, fix: str) -> None:
        """How a command streamed through ``host.popen`` ended (a fetch, a sync): a failure raises ``failure``'s."""
        if code != 0:
            raise self.failure(code, said, key, what, fix)

    def failure(self, code: int, said: str, key: str, what: str, fix: str) -> HpcTrainError:
        """A command on the cluster that ended with ``code`` (not 0): ssh's own failure (raised in ssh's words where
        it is known to say them, else told by ssh's exit status 255 or a killed session) is Unreachable; the
        cluster's side failing is a ConfigError naming ``key`` with ``fix``; ``what`` failed, in the command's words."""
        self.host.check(code, said)
        line = said.strip().splitlines()[-1] if said.strip() else f"exit status {code}"
        if code == SSH_FAILED or code < 0:
            return Unreachable(
                LOGIN_KEY,
                f"{what} failed: the connection to {self.target.login} ended ({line}).",
                "run the command again (a new connection opens).",
            )
        return ConfigError(key, f"{what} failed ({line}).", fix)

    def serve_words(self, action: str, *words: str) -> List[str]:
        return [self.settings.python, "-m", SERVE, action, *words]

    def serve(
        self, action: str, *words: str, stdin: Optional[bytes] = None, cwd: str = ""
    ) -> "subprocess.CompletedProcess[bytes]":
        return self.host.run(self.serve_words(action, *words), stdin=stdin, cwd=cwd)

    def serve_json(self, action: str, *words: str, stdin: Optional[object] = None, cwd: str = "") -> Dict:
        data = None if stdin is None else json.dumps(stdin).encode()
        done = self.serve(action, *words, stdin=data, cwd=cwd)
        if done.returncode != 0:
            raise self.failure(
                done.returncode,
                done.stderr.decode(errors="replace"),
                "cluster.remote_python",
                f"hpc_train's {action} on {self.target.login}",
                f"run `{self.settings.python} -m {SERVE} {action}` on the cluster itself to see why.",
            )
        return json.loads(done.stdout.decode().strip().splitlines()[-1])


def remote_path(cluster: Cluster, path: str) -> str:
    """``~`` expanded to the cluster's home."""
    return cluster.home + path[1:] if path == "~" or path.startswith("~/") else path
