"""The ``fault_tolerance`` keys a rank reads (declared in hpc_train.config.fault_tolerance). The launcher's own,
``spare_nodes`` and ``max_restarts``, are read by the launch side and the groups' supervisor from the groups' plan
(hpc_train.contracts.replica_plan), not here."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Optional

from hpc_train.config.fault_tolerance import KEY_RULES

# A job spec written before a key existed (a requeued job of an older version) reads that key's declared default
DEFAULTS = {rule.key.rsplit(".", 1)[1]: rule.default for rule in KEY_RULES}


@dataclass(frozen=True)
class ReplicaSettings:
    replica_groups: Optional[int]  # R; None: no replica groups
    min_replicas: int  # below this many live groups, steps wait for groups to return
    timeout_s: float  # how long a collective across the groups may take (and the join timeout's base)
    heartbeat_timeout_s: float  # how long a group may go without a heartbeat before the quorum goes on without it

    @property
    def enabled(self) -> bool:
        return self.replica_groups is not None and int(self.replica_groups) >= 2


def replica_settings(spec: Mapping[str, Any]) -> Optional[ReplicaSettings]:
    """The spec's ``fault_tolerance`` section when it asks for replica groups; None otherwise (or a spec without it)."""
    node = spec.get("fault_tolerance")
    if not node:
        return None
    values = {name: node[name] if name in node else DEFAULTS[name] for name in ReplicaSettings.__dataclass_fields__}
    settings = ReplicaSettings(**values)
    return settings if settings.enabled else None
