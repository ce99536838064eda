"""The ``container`` section as the launch side reads it: a frozen record, mounts parsed."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, Mapping, Optional, Tuple

from hpc_train.config.container import MOUNT_HPC_TRAIN, NO_CONTAINER, mount_parts

IMAGE_PYTHON = "python3"  # the image's interpreter, found on the image's own PATH


@dataclass(frozen=True)
class Mount:
    """One bind mount: ``source`` on the host at ``target`` in the container."""

    source: str
    target: str
    read_only: bool = False

    @property
    def spec(self) -> str:
        return f"{self.source}:{self.target}{':ro' if self.read_only else ''}"


def parse_mount(text: Any) -> Optional[Mount]:
    """`SRC:DST[:ro]` with absolute paths -> Mount; None when it is not that form."""
    parts = mount_parts(text)
    return None if parts is None else Mount(*parts)


@dataclass(frozen=True)
class ContainerSettings:
    """What the user asked for: the runtime's name and its keys (checked by the config's declarations)."""

    name: str = NO_CONTAINER
    image: Optional[str] = None
    mounts: Tuple[Mount, ...] = ()
    env: Tuple[Tuple[str, str], ...] = ()
    options: Tuple[str, ...] = ()
    command: Optional[str] = None
    hpc_train: str = MOUNT_HPC_TRAIN

    @property
    def enabled(self) -> bool:
        return self.name != NO_CONTAINER

    @classmethod
    def from_section(cls, section: Optional[Mapping[str, Any]]) -> "ContainerSettings":
        """From the config's ``container`` section (a plain mapping; absent: no container)."""
        if not section:
            return cls()
        mounts = tuple(m for m in (parse_mount(text) for text in section.get("mounts") or ()) if m is not None)
        env: Dict[str, Any] = dict(section.get("env") or {})
        return cls(
            name=str(section.get("name") or NO_CONTAINER),
            image=None if section.get("image") is None else str(section["image"]),
            mounts=mounts,
            env=tuple((str(k), str(v).lower() if isinstance(v, bool) else str(v)) for k, v in env.items()),
            options=tuple(str(o) for o in section.get("options") or ()),
            command=None if section.get("command") is None else str(section["command"]),
            hpc_train=str(section.get("hpc_train") or MOUNT_HPC_TRAIN),
        )
