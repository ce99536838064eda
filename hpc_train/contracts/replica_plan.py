"""A job of replica groups as its supervisor runs it (``fault_tolerance.replica_groups``): the one record of the
groups' shape and the keys their launcher reads, laid out once from the job layout.

The local launcher builds it from the run's plan; on Slurm the launch side builds it into the job step's
parameters (stored with the sbatch parameters, so a rerun runs the same plan) and hands it to the batch host's
agent as text on its command line (``--replicas``), which reads it back here: one typed record both ways, a field
missing or unknown refused by name. No torch, no Hydra.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any, Dict, List, Mapping

from hpc_train.contracts.job_layout import JobLayout, group_layout


@dataclass(frozen=True)
class ReplicaPlan:
    groups: int  # R, the replica groups
    group_nodes: int  # nodes of one group (locally: the one node)
    tasks_per_node: int  # a group's ranks on each of its nodes
    spare_nodes: int  # Slurm: nodes the job holds beyond the groups', to restart a failed group on at once
    min_replicas: int  # the lighthouse's least quorum
    timeout_s: float  # the lighthouse's and the quorum's timeout; the late groups' grace is built on it
    heartbeat_timeout_s: float  # the lighthouse drops a group silent this long
    max_restarts: int  # restarts of one group in one attempt before the run ends
    run_dir: str  # the run dir, absolute

    @property
    def group_size(self) -> int:
        """The ranks of one group (a job of its own to torch, RANK 0 to group_size - 1)."""
        return self.group_nodes * self.tasks_per_node

    def describe(self) -> str:
        return f"{self.groups} replica groups of {self.group_nodes} node(s) and {self.spare_nodes} spare node(s)"

    def launch_line(self, nodes: int, slurm: bool) -> str:
        """The launch's words on the groups, under the layout line of a dry run or a start (`nodes`: the job's
        nodes without the spares; on Slurm each group has whole nodes when there are as many nodes as groups)."""
        size = self.group_size
        where = f", {self.group_nodes} node(s) each" if slurm and nodes >= self.groups else ""
        spare = self.spare_nodes if slurm else 0
        held = f"; {spare} spare node(s): the job holds {nodes + spare}" if spare else ""
        return (
            f"{self.groups} replica groups of {size} rank{'s' if size > 1 else ''}{where}: a group that fails restarts"
            f" alone while the others train on (a group without a heartbeat is dropped after"
            f" {self.heartbeat_timeout_s:g} s){held}"
        )

    def lighthouse_command(self, python: str, port: int) -> List[str]:
        """The lighthouse's process (hpc_train.compute.replicas.lighthouse), as both launchers start it."""
        return [
            python,
            "-m",
            "hpc_train.compute.replicas.lighthouse",
            "--port",
            str(port),
            "--min-replicas",
            str(self.min_replicas),
            "--timeout-s",
            str(self.timeout_s),
            "--heartbeat-timeout-s",
            str(self.heartbeat_timeout_s),
        ]

    def record(self) -> Dict[str, Any]:
        """The plan as plain data (the job step's parameters keep it in this form)."""
        return asdict(self)

    def text(self) -> str:
        """The plan as the agent's ``--replicas`` carries it."""
        return json.dumps(self.record(), sort_keys=True)

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> "ReplicaPlan":
        """The plan back from its record; ValueError naming the field when one is missing or not the plan's."""
        names = [field.name for field in fields(cls)]
        unknown, missing = sorted(set(record) - set(names)), [name for name in names if name not in record]
        if unknown or missing:
            raise ValueError(
                f"not a replica groups' plan: missing {missing}, unknown {unknown}; the launch side and the batch host"
                " run different versions of hpc_train (submit again with one)"
            )
        types = {"timeout_s": float, "heartbeat_timeout_s": float, "run_dir": str}
        return cls(**{name: types.get(name, int)(record[name]) for name in names})

    @classmethod
    def from_text(cls, text: str) -> "ReplicaPlan":
        return cls.from_record(json.loads(text))


def replica_plan(layout: JobLayout, node: Mapping[str, Any], run_dir: Path) -> ReplicaPlan:
    """The plan of a job of `layout` whose ``fault_tolerance`` keys are `node` (replica_groups set): each group's
    share of the layout is contracts.job_layout.group_layout's, the one place that arithmetic is written."""
    groups = int(node["replica_groups"])
    group = group_layout(layout, groups)
    return ReplicaPlan(
        groups=groups,
        group_nodes=group.nodes,
        tasks_per_node=group.tasks_per_node,
        spare_nodes=int(node["spare_nodes"]),
        min_replicas=int(node["min_replicas"]),
        timeout_s=float(node["timeout_s"]),
        heartbeat_timeout_s=float(node["heartbeat_timeout_s"]),
        max_restarts=int(node["max_restarts"]),
        run_dir=str(Path(run_dir).absolute()),
    )
