"""Paths in a laptop's overrides, said the cluster's way: under the synced project, their copies there; any other
absolute path is the cluster's own, and one that exists only on this machine is refused before anything is queued."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Sequence

from hpc_train.config.errors import ConfigError
from hpc_train.hosts.ssh import SshTarget
from hpc_train.remote.connection import Connection
from hpc_train.remote.settings import RemoteSettings

# An absolute path in an override's value: the whole value, an item of a list, or after '=' (--data=/x).
# Stands for the cluster's home in a script rendered here while no connection is open (absolute, as the renderer needs
# its paths; printed as ~).
_HOME_MARK = "/HPC_TRAIN_CLUSTER_HOME"
_ABSOLUTE = re.compile(r"(?:(?<=^)|(?<=[=,\[\s'\"]))(/[^,\]\s'\"]*)")


def remote_of(path: str, local_root: Path, remote_root: str) -> str:
    """``path`` on the cluster: its copy when it lies under the project, itself otherwise."""
    try:
        rel = Path(os.path.abspath(path)).relative_to(local_root.resolve())
    except ValueError:
        return path
    return remote_root if str(rel) == "." else f"{remote_root}/{rel.as_posix()}"


@dataclass(frozen=True)
class ClusterSide:
    """Where a forwarded job's files and Python are on the cluster: as the cluster said when a connection is open
    (``resolved``), else as the profile names them, ``~`` and a bare ``cluster.remote_python`` still to be filled in
    there."""

    login: str
    python: str  # the cluster's Python: its full path there when resolved, else cluster.remote_python's words
    project: str  # the synced project's folder there: absolute when resolved, else maybe under ~
    local_root: Path
    resolved: bool

    def path_of(self, local: Path) -> str:
        """A local path (a run dir) as the cluster's hpc_train will have it."""
        return remote_of(str(local), self.local_root, self.project)

    def render_dir(self, local: Path) -> Path:
        """The run dir to render the cluster's script with: absolute, its home marked when not resolved."""
        there = self.path_of(local)
        return Path(_HOME_MARK + there[1:] if there == "~" or there.startswith("~/") else there)

    @staticmethod
    def shown(text: str) -> str:
        """A script rendered with ``render_dir``'s paths, as printed: the home mark back to ``~``."""
        return text.replace(_HOME_MARK, "~")

    def note(self, run_dir: str) -> str:
        """The dry run's words on the script it printed: whose it is, and what the cluster fills in."""
        said = f"the script as {self.login}'s hpc_train will submit it: its Python {self.python}, the run dir {run_dir}"
        if self.resolved:
            return f"{said} there"
        filled = [f"the Python cluster.remote_python={self.python} finds there after cluster.setup's lines"]
        if run_dir.startswith("~"):
            filled.insert(0, f"~ (your home on {self.login}; sbatch does not expand it)")
        return f"{said}; with no connection open, {self.login} fills in {' and '.join(filled)}"


def cluster_side(settings: RemoteSettings, local_root: Path) -> ClusterSide:
    """The cluster's side of a laptop's dry run: asked over the connection when one is open (no new one is made)."""
    login = str(settings.login)
    if SshTarget(login).master_alive():
        cluster = Connection(settings).open(settings.project_dir(local_root))
        return ClusterSide(login, cluster.python, cluster.project, local_root, resolved=True)
    return ClusterSide(login, settings.python, settings.project_dir(local_root), local_root, resolved=False)


def translate(overrides: Sequence[str], local_root: Path, remote_root: str, conn: Connection) -> List[str]:
    """The overrides with their paths translated; a path only this machine has is a ConfigError naming its key."""
    translated: List[str] = []
    foreign: Dict[str, str] = {}  # a local path outside the project -> its key

    def _swap(found: "re.Match[str]", key: str) -> str:
        path = found.group(1)
        moved = remote_of(path, local_root, remote_root)
        if moved == path and os.path.exists(path):
            foreign[path] = key.lstrip("+~")
        return moved

    for override in overrides:
        key, sep, value = override.partition("=")
        if not sep:
            translated.append(override)
            continue

        translated.append(f"{key}={_ABSOLUTE.sub(lambda found, k=key: _swap(found, k), value)}")
    if foreign:
        there = conn.serve_json("exists", stdin=sorted(foreign))
        for path, key in foreign.items():
            if not there.get(path):
                raise ConfigError(
                    key,
                    f"{path} is a path of this machine, and the cluster ({conn.target.login}) has no {path}; only the"
                    f" project ({local_root}) is copied there.",
                    f"copy it to the cluster and give the cluster's path (e.g. rsync -a {path} {conn.target.login}:"
                    f"data/), or put it under {local_root}, which is synced (mind cluster.sync_limit_mb).",
                )
    return translated
