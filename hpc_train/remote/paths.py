"""Paths in a laptop's overrides, said the cluster's way: under the synced project, their copies there; any other
absolute path is the cluster's own, and one that exists only on this machine is refused before anything is queued."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Dict, List, Sequence

from hpc_train.config.errors import ConfigError
from hpc_train.remote.connection import Connection

# An absolute path in an override's value: the whole value, an item of a list, or after '=' (--data=/x).
_ABSOLUTE = re.compile(r"(?:(?<=^)|(?<=[=,\[\s'\"]))(/[^,\]\s'\"]*)")


def remote_of(path: str, local_root: Path, remote_root: str) -> str:
    """``path`` on the cluster: its copy when it lies under the project, itself otherwise."""
    try:
        rel = Path(os.path.abspath(path)).relative_to(local_root.resolve())
    except ValueError:
        return path
    return remote_root if str(rel) == "." else f"{remote_root}/{rel.as_posix()}"


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
