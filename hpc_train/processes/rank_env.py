"""The variables torchrun gives each rank it starts: both sides name them from here (no torch).

A rank of a one-rank-per-GPU layout gets them (computed by its task); a one-process layout's
script must see none (``python script.py`` sees none), and a Slurm job must not carry a login
shell's leftovers of them to its ranks. torchrun's agent also sets ``TORCHELASTIC_*``
variables of its own; with no agent they are never set, and always removed: a stale
``TORCHELASTIC_USE_AGENT_STORE`` would send ``init_process_group`` to a store that is not there.
"""

from __future__ import annotations

import re

TORCHRUN_VARIABLES = (
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "GROUP_WORLD_SIZE",
    "NODE_RANK",
    "ROLE_RANK",
    "ROLE_NAME",
    "ROLE_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
)
AGENT_PREFIX = "TORCHELASTIC_"


def is_torchrun_variable(key: str) -> bool:
    return key in TORCHRUN_VARIABLES or key.startswith(AGENT_PREFIX)


def unset_line() -> str:
    """The batch script's first setup line: the login shell's torchrun variables stay on the login node (a
    ``cluster.setup`` line after it may still export MASTER_ADDR or MASTER_PORT on purpose)."""
    return f"unset {' '.join(TORCHRUN_VARIABLES)} ${{!{AGENT_PREFIX}@}}"


# The local launcher's rendezvous: it binds and listens on MASTER_PORT itself and hands the listening socket to rank
# 0 as this descriptor (its TCPStore serves on it), so no other process takes the port in between; set on every
# rank of such a launch (the others connect through the same kind of store), never inherited by a nested launch.
MASTER_FD_VARIABLE = "HPC_TRAIN_MASTER_FD"

PORT_BASE = 20000
PORT_SPAN = 12768  # 20000 .. 32767: clear of the ephemeral range 32768-60999


# The ports of a job's own steps (a packed allocation's runs, a job's replica groups): a band of their own below the
# jobs' ports, one block of STEP_PORTS per job. Taken right after the job's own port, they were the ports of the next
# jobs, which often run at the same time on the same node.
STEP_PORT_BASE = 10000
STEP_PORTS = 500  # per job
STEP_BLOCKS = 20  # 10000 .. 19999: the steps of 20 consecutive jobs never share a port


def port_for_job(job_id: str) -> int:
    """A rendezvous port that differs between jobs (array tasks included) sharing a node; a job's steps take
    ``step_port``s, never the port of another job."""
    return PORT_BASE + _job_number(job_id) % PORT_SPAN


def step_port(job_id: str, index: int) -> int:
    """The rendezvous port of a job's ``index``-th step (a packed allocation's slot, a replica group): in the job's
    block of the steps' band, so never another job's port (port_for_job), nor a step's of the STEP_BLOCKS - 1 jobs
    queued just before or after it."""
    if not 0 <= index < STEP_PORTS:
        raise ValueError(f"a job has {STEP_PORTS} step ports (0 .. {STEP_PORTS - 1}), not {index}")
    return STEP_PORT_BASE + (_job_number(job_id) % STEP_BLOCKS) * STEP_PORTS + index


def _job_number(job_id: str) -> int:
    """A job id's digits (an array task's ``123_7`` is 1237)."""
    return int(re.sub(r"\D", "", str(job_id)) or "0")


# Replica groups (fault_tolerance.replica_groups): each group is a job of its own to torch (RANK and WORLD_SIZE
# within the group, its own rendezvous); these say which group a process belongs to. The launchers set them, the
# ranks read them (hpc_train.compute.runtime.ranks, hpc_train.compute.replicas).
REPLICA_GROUP_VARIABLE = "HPC_TRAIN_REPLICA_GROUP"  # this process's group, 0 .. R-1
REPLICA_GROUPS_VARIABLE = "HPC_TRAIN_REPLICA_GROUPS"  # R
REPLICA_RESTART_VARIABLE = "HPC_TRAIN_REPLICA_RESTART"  # how many times this group was restarted in this attempt
LIGHTHOUSE_VARIABLE = "HPC_TRAIN_LIGHTHOUSE"  # the lighthouse's address, http://host:port
