"""Which rank am I? Read from the environment of whatever started this process.

Sources, in a pinned order (the first that applies wins):

1. torchrun, recognised by its own marker ``TORCHELASTIC_RUN_ID``, also inside an srun step
   (torchrun under srun is common): ``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``,
   ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``.
2. hpc-train's local launcher, recognised by ``HPC_TRAIN_LOCAL_LAUNCHER=1``: the same variables.
3. An srun step (``SLURM_PROCID`` with ``SLURM_STEP_NUM_TASKS``, which only a step has: a batch
   script's ``SLURM_NTASKS`` says 4 while one process runs). The world is the step's task count,
   ``local_world_size`` the task count of this task's own node (``SLURM_NODEID`` indexes
   ``SLURM_STEP_TASKS_PER_NODE``, e.g. ``3,1`` or ``4(x2),3``), the rendezvous host the first
   host of ``SLURM_STEP_NODELIST`` / ``SLURM_JOB_NODELIST`` / ``SLURM_NODELIST``. Bare ``RANK`` /
   ``WORLD_SIZE`` left exported in a shell are ignored here (they would make every task rank 0).
4. submitit's local executor (``SUBMITIT_LOCAL_*``).
5. Bare ``RANK`` and ``WORLD_SIZE`` without a marker (another launcher): honoured, with a warning
   naming them (:attr:`RankInfo.note`).
6. Otherwise one plain process.

Rendezvous port of Slurm and submitit jobs: ``20000 + job id mod 12768``, i.e. 20000-32767.
That is below Linux's ephemeral range (32768-60999 by default, ``net.ipv4.ip_local_port_range``),
from which the kernel picks the local port of every outgoing connection on the node, so such a
connection cannot already hold it; and two jobs sharing a node (array tasks have job ids of
their own) get different ports unless their ids differ by a multiple of 12768. ``MASTER_PORT``
(and ``MASTER_ADDR``) in the environment override it.

This module is pure Python so that it can be tested (and used) without torch.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import List, Mapping, Optional

from hpc_train.hostlist import first_host

PORT_BASE = 20000
PORT_SPAN = 12768  # 20000 .. 32767: clear of the ephemeral range 32768-60999
LOCAL_LAUNCHER_MARK = "HPC_TRAIN_LOCAL_LAUNCHER"
# How each source reads in a rank's first log line ("ranks from ...").
SOURCE_WORDS = {
    "torchrun": "torchrun",
    "local": "the local launcher",
    "slurm": "srun",
    "submitit": "submitit's local executor",
    "environment": "bare RANK/WORLD_SIZE variables",
    "single": "no launcher: one process",
}


@dataclass(frozen=True)
class RankInfo:
    rank: int
    local_rank: int
    world_size: int
    local_world_size: int
    master_addr: str
    master_port: int
    source: str  # "torchrun" | "local" | "slurm" | "submitit" | "environment" | "single"
    note: str = ""  # a warning for the rank's log (e.g. variables that were ignored or guessed from)

    @property
    def origin(self) -> str:
        """Who started this process, in words (the `source` for people)."""
        return SOURCE_WORDS.get(self.source, self.source)

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


def tasks_per_node(notation: str) -> List[int]:
    """Expand Slurm's ``4(x2),3`` task counts to one count per node: ``[4, 4, 3]``."""
    counts: List[int] = []
    for item in notation.split(","):
        match = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", item.strip())
        if match is None:
            raise ValueError(f"cannot read Slurm's tasks-per-node value {notation!r} (expected e.g. 4(x2),3)")
        counts.extend([int(match.group(1))] * int(match.group(2) or 1))
    return counts


def _torchrun_style(env: Mapping[str, str], source: str, note: str = "") -> RankInfo:
    world = int(env["WORLD_SIZE"])
    return RankInfo(
        rank=int(env["RANK"]),
        local_rank=int(env.get("LOCAL_RANK", "0")),
        world_size=world,
        local_world_size=int(env.get("LOCAL_WORLD_SIZE", str(world))),
        master_addr=env.get("MASTER_ADDR", "127.0.0.1"),
        master_port=int(env.get("MASTER_PORT", "29500")),
        source=source,
        note=note,
    )


def _from_torchrun(env: Mapping[str, str]) -> Optional[RankInfo]:
    if "TORCHELASTIC_RUN_ID" not in env:
        return None
    return _torchrun_style(env, "torchrun")


def _from_local_launcher(env: Mapping[str, str]) -> Optional[RankInfo]:
    if env.get(LOCAL_LAUNCHER_MARK) != "1":
        return None
    return _torchrun_style(env, "local")


def _from_slurm(env: Mapping[str, str]) -> Optional[RankInfo]:
    if "SLURM_PROCID" not in env or "SLURM_STEP_NUM_TASKS" not in env:
        return None
    world = int(env["SLURM_STEP_NUM_TASKS"])
    nodelist = (
        env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST") or "localhost"
    )
    counts = tasks_per_node(env.get("SLURM_STEP_TASKS_PER_NODE") or env.get("SLURM_TASKS_PER_NODE") or str(world))
    node = int(env.get("SLURM_NODEID", "0"))
    port = int(env["MASTER_PORT"]) if "MASTER_PORT" in env else port_for_job(env.get("SLURM_JOB_ID", "0"))
    ignored = [key for key in ("RANK", "WORLD_SIZE") if key in env]
    note = (
        f"{' and '.join(ignored)} in the environment ignored: this is an srun step, whose SLURM_PROCID and"
        " SLURM_STEP_NUM_TASKS say the rank"
        if ignored
        else ""
    )
    return RankInfo(
        rank=int(env["SLURM_PROCID"]),
        local_rank=int(env.get("SLURM_LOCALID", "0")),
        world_size=world,
        local_world_size=counts[node] if node < len(counts) else counts[0],
        master_addr=env.get("MASTER_ADDR") or first_host(nodelist),
        master_port=port,
        source="slurm",
        note=note,
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


def _from_bare_variables(env: Mapping[str, str]) -> Optional[RankInfo]:
    if "RANK" not in env or "WORLD_SIZE" not in env:
        return None
    note = (
        f"rank {env['RANK']} of WORLD_SIZE={env['WORLD_SIZE']} taken from bare RANK and WORLD_SIZE variables (no"
        " torchrun, hpc-train launcher or srun step around this process); unset them if they are left over in your"
        " shell"
    )
    return _torchrun_style(env, "environment", note)


def detect_ranks(env: Optional[Mapping[str, str]] = None) -> RankInfo:
    """Return this process's place in the job from the first source that applies (see the module doc)."""
    env = os.environ if env is None else env
    for source in (_from_torchrun, _from_local_launcher, _from_slurm, _from_submitit, _from_bare_variables):
        info = source(env)
        if info is not None:
            return info
    return RankInfo(0, 0, 1, 1, "127.0.0.1", 29500, "single")


def world_mismatch(info: RankInfo, planned: int, env: Optional[Mapping[str, str]] = None) -> Optional[str]:
    """Why this process cannot be a rank of a job planned for `planned` ranks; None when it can."""
    if info.world_size == planned:
        return None
    env = os.environ if env is None else env
    message = (
        f"this job was planned for {planned} rank(s), but this process is rank {info.rank} of {info.world_size} (from"
        f" {info.source})"
    )
    if info.source == "single" and env.get("SLURM_JOB_ID"):
        fix = (
            f"inside a Slurm allocation start the ranks with srun: srun -n {planned} python -m hpc_train.compute.worker"
            " RUN_DIR/job_config.yaml (a batch script's own shell is one process)."
        )
    elif info.source == "slurm":
        fix = (
            f"start the step with {planned} tasks (srun -n {planned}, or the job's --nodes x --ntasks-per-node), or"
            f" plan the job for {info.world_size} (resources.nodes / resources.gpus_per_node)."
        )
    elif info.source == "torchrun":
        fix = (
            f"start torchrun with {planned} processes in all (--nnodes x --nproc_per_node), or set"
            " resources.gpus_per_node to match --nproc_per_node."
        )
    else:
        fix = (
            "start the job with hpc-train, which starts every rank, or with a launcher that starts the planned number"
            " of processes."
        )
    return f"{message}. Fix: {fix}"
