"""The cluster a laptop submits to, read once from the composed config (``cluster.login`` and the keys beside it),
and the link a local run dir keeps to its copy on the cluster (``remote.json``)."""

from __future__ import annotations

import json
import shlex
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, List, Optional, Tuple

from hpc_train.config import default_of
from hpc_train.records import rundir

CONNECT_COMMAND = "hpc-train-connect"
DEFAULT_PARENT = "~/hpc-train"  # cluster.remote_dir's default: ~/hpc-train/<name of the submitting directory>


@dataclass(frozen=True)
class RemoteSettings:
    """``cluster.login`` and what goes with it; ``login`` None: this machine is the login node."""

    login: Optional[str]
    remote_dir: Optional[str] = None
    python: str = default_of("cluster.remote_python")
    setup: List[str] = field(default_factory=list)
    sync: str = default_of("cluster.sync")
    sync_limit_mb: int = default_of("cluster.sync_limit_mb")
    profile: str = ""
    # the words after hpc-train-connect that name this cluster as the command did (its --config-dir, its cluster
    # choice and its cluster.* overrides); empty: the profile's name, else the login, says it
    connect_words: Tuple[str, ...] = ()

    @classmethod
    def of(cls, cfg: Any) -> "RemoteSettings":
        """From a composed config, checked or not: a profile that leaves a key out gets its declared default."""
        cluster = cfg.cluster

        def key(name: str) -> Any:
            value = cluster.get(name)
            return default_of(f"cluster.{name}") if value is None else value

        return cls(
            login=str(key("login")) if key("login") else None,
            remote_dir=str(key("remote_dir")) if key("remote_dir") else None,
            python=str(key("remote_python")),
            setup=[str(line) for line in key("setup")],
            sync=str(key("sync")),
            sync_limit_mb=int(key("sync_limit_mb")),
            profile=str(cluster.get("name") or ""),
        )

    @property
    def enabled(self) -> bool:
        return self.login is not None

    def connect_command(self) -> str:
        """The hpc-train-connect command that opens this cluster's connection, pasted as it is."""
        if self.connect_words:
            words = shlex.join(self.connect_words)
        else:
            words = f"cluster={self.profile}" if self.profile else shlex.quote(str(self.login))
        return f"{CONNECT_COMMAND} {words}"

    def project_dir(self, local_root: Path) -> str:
        """Where the project at ``local_root`` lives on the cluster (``~`` still to expand there)."""
        return self.remote_dir or f"{DEFAULT_PARENT}/{local_root.resolve().name}"


@dataclass(frozen=True)
class RemoteLink:
    """What a local run (or sweep) dir knows of its copy on the cluster: how to reach it and where it is."""

    login: str
    path: str  # the run (or sweep) dir on the cluster, absolute
    python: str
    setup: List[str]
    command: str = ""  # the forwarded command that made it (serve's id)

    def settings(self) -> RemoteSettings:
        return RemoteSettings(login=self.login, python=self.python, setup=list(self.setup))


def write_link(local_dir: Path, link: RemoteLink) -> None:
    rundir.write_text_atomic(local_dir / rundir.REMOTE_LINK, json.dumps(asdict(link), indent=1))


def read_link(local_dir: Path) -> Optional[RemoteLink]:
    """The link of ``local_dir``, or of the sweep dir above it (a sweep's job dir), mapped to this dir; None: local."""
    here = Path(local_dir)
    for up, parts in ((here, ()), (here.parent, (here.name,)), (here.parent.parent, (here.parent.name, here.name))):
        try:
            data = json.loads((up / rundir.REMOTE_LINK).read_text())
        except (OSError, ValueError):
            continue
        link = RemoteLink(**data)
        return RemoteLink(**{**asdict(link), "path": "/".join([link.path.rstrip("/"), *parts])})
    return None
