"""The fault_tolerance node of conf/config.yaml: replica groups that survive each other's failure (torchft).

Each key is checked here on its own; what the keys must agree on with the strategy, the layout and the launcher
(the world splits into the groups, whole nodes a group on Slurm, torchft installed) is checked by
``launch/planning/replica_checks.py`` before anything is queued. The ranks read the node through
``hpc_train.compute.replicas.settings``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Tuple

from hpc_train.config.checks import Problem, number, show, whole
from hpc_train.config.rule import R, Rule

TORCHFT_INSTALL = 'pip install "hpc-train[ft]"'  # what the groups need where the ranks run

KEY_RULES: Tuple[Rule, ...] = (
    R(
        "fault_tolerance.replica_groups",
        whole(2),
        3,
        null="no replica groups: a failure ends the job attempt, as without this node",
        fix="set e.g. fault_tolerance.replica_groups=2 (2 or more groups), or fault_tolerance.replica_groups=null"
        " (no replica groups).",
        doc="R >= 2 splits the job's data parallelism into R replica groups that survive each other's failure"
        " (torchft); null: off.",
        default=None,
    ),
    R(
        "fault_tolerance.min_replicas",
        whole(1),
        1,
        fix="set e.g. fault_tolerance.min_replicas=1 (training steps while at least one group is live).",
        doc="Below this many live groups, training waits for groups to return instead of stepping.",
        default=1,
    ),
    R(
        "fault_tolerance.timeout_s",
        number(0, low_open=True),
        60,
        fix="set e.g. fault_tolerance.timeout_s=60 (seconds, more than 0).",
        doc="Seconds a collective across the groups (and the transfer of a live group's state) may take before it"
        " fails; a group that heartbeats but does not ask for the quorum is left out after twice as long.",
        default=60,
    ),
    R(
        "fault_tolerance.heartbeat_timeout_s",
        number(0, low_open=True),
        5,
        fix="set e.g. fault_tolerance.heartbeat_timeout_s=5 (seconds, more than 0).",
        doc="Seconds without a heartbeat from a group (its process or node died) before the quorum goes on without"
        " it: the others' pause after a death. torchft's native thread heartbeats every 0.1 s, through a Python"
        " pause (a garbage collection, a slow checkpoint).",
        default=5,
    ),
    R(
        "fault_tolerance.spare_nodes",
        whole(0),
        1,
        fix="set e.g. fault_tolerance.spare_nodes=1 (0: a failed group waits for its nodes to return).",
        doc="Slurm: nodes held beyond the groups' own, on which a failed group restarts at once (0: a failed group"
        " waits for its nodes to return).",
        default=1,
    ),
    R(
        "fault_tolerance.max_restarts",
        whole(0),
        3,
        fix="set e.g. fault_tolerance.max_restarts=3 (0: the first failure of a group fails the job).",
        doc="How many times one group may be restarted in one job attempt before the whole job fails.",
        default=3,
    ),
)
KEYS = tuple(rule.key.rsplit(".", 1)[1] for rule in KEY_RULES)


def fault_tolerance_node(value: Any) -> Problem:
    """The fault_tolerance node, when a config has it: a mapping of KEYS (each key checked by its own rule)."""
    if not isinstance(value, Mapping):
        return f"must be a mapping of {', '.join(KEYS)}, got {show(value)}"
    unknown = [str(k) for k in value if k not in KEYS]
    return f"has no key {unknown[0]!r} (it has {', '.join(KEYS)})" if unknown else None


# The node itself is no declared key: a config without it (your own primary config, or ~fault_tolerance) runs without
# replica groups, as a config without the script section runs hpc_train's trainer, and the ranks read it so
# (hpc_train.compute.replicas.settings); inside the node, each key left out is filled with its default. A value that
# is no mapping (fault_tolerance=3) or a key the node does not have is refused naming it, with NODE_FIX, by
# launch/planning/replica_checks.py, before anything is queued.
NODE_FIX = (
    "set e.g. fault_tolerance.replica_groups=2 (and fault_tolerance.min_replicas, timeout_s, heartbeat_timeout_s,"
    " spare_nodes, max_restarts), or fault_tolerance.replica_groups=null (no replica groups)."
)

RULES: Tuple[Rule, ...] = KEY_RULES
