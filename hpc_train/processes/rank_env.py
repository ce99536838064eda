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


def port_for_job(job_id: str) -> int:
    """A rendezvous port that differs between jobs (array tasks included) sharing a node; a packed allocation's
    job steps take the ports after its own (hpc_train.pack.scheduler)."""
    digits = re.sub(r"\D", "", str(job_id)) or "0"
    return PORT_BASE + int(digits) % PORT_SPAN


# Replica groups (fault_tolerance.replica_groups): each group is a job of its own to torch (RANK and WORLD_SIZE
# within the group, its own rendezvous); these say which group a process belongs to. The launchers set them, the
# ranks read them (hpc_train.compute.runtime.ranks, hpc_train.compute.replicas).
REPLICA_GROUP_VARIABLE = "HPC_TRAIN_REPLICA_GROUP"  # this process's group, 0 .. R-1
REPLICA_GROUPS_VARIABLE = "HPC_TRAIN_REPLICA_GROUPS"  # R
REPLICA_RESTART_VARIABLE = "HPC_TRAIN_REPLICA_RESTART"  # how many times this group was restarted in this attempt
LIGHTHOUSE_VARIABLE = "HPC_TRAIN_LIGHTHOUSE"  # the lighthouse's address, http://host:port
