"""The ``fault_tolerance`` keys a rank reads (declared in hpc_train.config.fault_tolerance)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Optional


@dataclass(frozen=True)
class ReplicaSettings:
    replica_groups: Optional[int]  # R; None: no replica groups
    min_replicas: int  # below this many live groups, steps wait for groups to return
    timeout_s: float  # how long a step waits for a silent group before dropping it
    spare_nodes: int  # Slurm: nodes held for restarting a failed group at once
    max_restarts: int  # restarts of one group in one attempt before the whole job fails

    @property
    def enabled(self) -> bool:
        return self.replica_groups is not None and int(self.replica_groups) >= 2


def replica_settings(spec: Mapping[str, Any]) -> Optional[ReplicaSettings]:
    """The spec's ``fault_tolerance`` section when it asks for replica groups; None otherwise (or a spec without it)."""
    node = spec.get("fault_tolerance")
    if not node:
        return None
    settings = ReplicaSettings(**{name: node[name] for name in ReplicaSettings.__dataclass_fields__})
    return settings if settings.enabled else None
