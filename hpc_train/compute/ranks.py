"""Work out who this process is in the job: rank, local rank, world size, rendezvous address.

Sources are tried in a fixed order, the first that applies wins:

1. torchrun-style variables (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``,
   ``MASTER_PORT``); the local launcher sets these too.
2. Slurm task variables (``SLURM_PROCID``, ``SLURM_LOCALID``, ``SLURM_NTASKS``, ...), as set by
   ``srun`` for every task of a step. The rendezvous host is the first host of the node list
   and the port is derived from the job id, so two jobs sharing a node do not collide.
3. submitit's job environment (its local executor sets ``SUBMITIT_LOCAL_*``).
4. Otherwise: one plain process.

This module is pure Python so that it can be tested (and used) without torch.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Mapping, Optional

from hpc_train.hostlist import first_host

PORT_BASE = 20000
PORT_SPAN = 20000


@dataclass(frozen=True)
class RankInfo:
    rank: int
    local_rank: int
    world_size: int
    local_world_size: int
    master_addr: str
    master_port: int
    source: str  # "torchrun" | "slurm" | "submitit" | "single"

    @property
    def is_distributed(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def port_for_job(job_id: str) -> int:
    """A rendezvous port that differs between jobs (array tasks included) sharing a node."""
    digits = re.sub(r"\D", "", str(job_id)) or "0"
    return PORT_BASE + int(digits) % PORT_SPAN


def _tasks_on_first_node(tasks_per_node: str) -> int:
    """Parse Slurm's ``4(x2),3`` notation and return the first node's task count."""
    head = tasks_per_node.split(",")[0]
    return int(head.split("(")[0])


def _from_torchrun(env: Mapping[str, str]) -> Optional[RankInfo]:
    if "RANK" not in env or "WORLD_SIZE" not in env:
        return None
    world = int(env["WORLD_SIZE"])
    return RankInfo(
        rank=int(env["RANK"]),
        local_rank=int(env.get("LOCAL_RANK", "0")),
        world_size=world,
        local_world_size=int(env.get("LOCAL_WORLD_SIZE", str(world))),
        master_addr=env.get("MASTER_ADDR", "127.0.0.1"),
        master_port=int(env.get("MASTER_PORT", "29500")),
        source="torchrun",
    )


def _from_slurm(env: Mapping[str, str]) -> Optional[RankInfo]:
    # SLURM_STEP_NUM_TASKS exists only inside an srun step; a batch script (where SLURM_NTASKS
    # already says e.g. 4 but only one process runs) must not think it is rank 0 of 4.
    if "SLURM_PROCID" not in env or "SLURM_STEP_NUM_TASKS" not in env:
        return None
    world = int(env["SLURM_STEP_NUM_TASKS"])
    nodelist = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST") or "localhost"
    tasks_per_node = env.get("SLURM_STEP_TASKS_PER_NODE") or env.get("SLURM_TASKS_PER_NODE") or str(world)
    port = int(env["MASTER_PORT"]) if "MASTER_PORT" in env else port_for_job(env.get("SLURM_JOB_ID", "0"))
    return RankInfo(
        rank=int(env["SLURM_PROCID"]),
        local_rank=int(env.get("SLURM_LOCALID", "0")),
        world_size=world,
        local_world_size=_tasks_on_first_node(tasks_per_node),
        master_addr=env.get("MASTER_ADDR") or first_host(nodelist),
        master_port=port,
        source="slurm",
    )


def _from_submitit(env: Mapping[str, str]) -> Optional[RankInfo]:
    if "SUBMITIT_LOCAL_GLOBALID" not in env:
        return None
    world = int(env.get("SUBMITIT_LOCAL_NTASKS", "1"))
    return RankInfo(
        rank=int(env["SUBMITIT_LOCAL_GLOBALID"]),
        local_rank=int(env.get("SUBMITIT_LOCAL_LOCALID", "0")),
        world_size=world,
        local_world_size=world,
        master_addr="127.0.0.1",
        master_port=port_for_job(env.get("SUBMITIT_LOCAL_JOB_ID", "0")),
        source="submitit",
    )


def detect_ranks(env: Optional[Mapping[str, str]] = None) -> RankInfo:
    """Return this process's place in the job from the first source that applies."""
    env = os.environ if env is None else env
    for source in (_from_torchrun, _from_slurm, _from_submitit):
        info = source(env)
        if info is not None:
            return info
    return RankInfo(0, 0, 1, 1, "127.0.0.1", 29500, "single")
