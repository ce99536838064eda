"""Which rank am I? Read from the environment of whatever started this process.

Sources, in a pinned order (the first that applies wins):

1. torchrun, recognised by its own marker ``TORCHELASTIC_RUN_ID``, also inside an srun step
   (torchrun under srun is common): ``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``,
   ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``.
2. hpc-train's local launcher, recognised by ``HPC_TRAIN_LOCAL_LAUNCHER=1``: the same variables.
3. An srun step (``SLURM_PROCID`` with ``SLURM_STEP_NUM_TASKS``, which only a step has: a batch
   script's ``SLURM_NTASKS`` says 4 while one process runs). See "Slurm steps" below.
4. submitit's local executor (``SUBMITIT_LOCAL_*``).
5. Bare ``RANK`` and ``WORLD_SIZE`` without a marker (another launcher): honoured, with a warning
   naming them (:attr:`RankInfo.note`).
6. Otherwise one plain process.

Slurm steps: the step's real task layout, never the job's
---------------------------------------------------------
The job's variables describe the allocation, not the step that started this process: in
``sbatch --nodes=2 --ntasks=3`` Slurm places 2 tasks on one node and 1 on the other, and an
``srun -n3`` inside a ``--nodes=2 --ntasks-per-node=2`` allocation runs 3 tasks while
``SLURM_NTASKS_PER_NODE`` still says 2 (so "tasks per node x nodes" would be 4). So, in one table:

====================  =================================  ==========================================
what                  read from                          never from
====================  =================================  ==========================================
world size            ``SLURM_STEP_NUM_TASKS``           ``SLURM_NTASKS`` (the job's, in a batch
                                                         script), ``SLURM_NTASKS_PER_NODE`` x nodes
rank                  ``SLURM_PROCID``                   ``RANK`` left in a shell (ignored, noted)
local rank            ``SLURM_LOCALID``
local world size      this node's entry of               ``SLURM_NTASKS_PER_NODE`` (the job's
                      ``SLURM_STEP_TASKS_PER_NODE``      request, stale inside a smaller step)
                      (``2,1``, ``4(x2),3``; fallback
                      ``SLURM_TASKS_PER_NODE``), indexed
                      by ``SLURM_NODEID`` (numbered
                      within the step)
hosts, rendezvous     ``SLURM_STEP_NODELIST`` (fallback
                      ``SLURM_JOB_NODELIST`` /
                      ``SLURM_NODELIST``), first host
====================  =================================  ==========================================

An uneven layout (``2,1``) is read as it is: each rank gets its real local rank and local world
size, and the rank's log gets a note naming the layout. Variables that contradict each other
(tasks per node that do not add up to the step's task count, a node id past the list, a local
id not below its node's task count) raise ValueError, which the worker turns into a refusal
at start ("cannot tell this process's rank ..."): never a guessed local world size.

Decision for a job spec planned for another world: every job spec fixes its world
(``resources.nodes`` x tasks per node), or, for a range of nodes (``resources.nodes=2-4``), the worlds
of every count of the range (the job follows the allocation Slurm gave, see ``allocation.py``), so a step
whose task count is none of them is refused by :func:`world_mismatch` before any process group forms,
naming the plan and the step's real layout, e.g. "this job was planned for 4 rank(s), but this
srun step runs 3 task(s) (2 on hpcnode1, 1 on hpcnode2); ...", and the fix. A step whose task count
equals the plan runs, however Slurm spread its tasks: a job spec planned for 3 ranks runs with
world 3 on a 2 + 1 step. The plain sbatch scripts (``sbatch/*.slurm``) refuse a mismatching
``SLURM_NTASKS`` even earlier, in their batch step (``launcher=sbatch``), before srun starts
any rank.

Rendezvous port of Slurm and submitit jobs: ``20000 + job id mod 12768``, i.e. 20000-32767.
That is below Linux's ephemeral range (32768-60999 by default, ``net.ipv4.ip_local_port_range``),
from which the kernel picks the local port of every outgoing connection on the node, so such a
connection cannot already hold it; and two jobs sharing a node (array tasks have job ids of
their own) get different ports unless their ids differ by a multiple of 12768. A job's own steps
(a packed allocation's runs, a job's replica groups) are given ports of their own, 10000-19999
(hpc_train.processes.rank_env.step_port), never another job's. ``MASTER_PORT`` (and ``MASTER_ADDR``)
in the environment override it.

This module is pure Python so that it can be tested (and used) without torch.
"""

from __future__ import annotations

import os
import re
from collections import Counter
from dataclasses import dataclass, replace
from typing import List, Mapping, Optional, Sequence, Tuple

from hpc_train.processes.rank_env import REPLICA_GROUP_VARIABLE, REPLICA_GROUPS_VARIABLE, port_for_job
from hpc_train.records.metrics_log import LOCAL_LAUNCHER_VARIABLE
from hpc_train.slurm.hostlist import expand_hostlist

# How each source reads in a rank's first log line ("ranks from ...").
SOURCE_WORDS = {
    "torchrun": "torchrun",
    "local": "the local launcher",
    "srun": "srun",
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
    source: str  # "torchrun" | "local" | "srun" | "submitit" | "environment" | "single"
    note: str = ""  # a warning for the rank's log (e.g. variables that were ignored or guessed from)
    node_tasks: Tuple[int, ...] = ()  # srun steps: the step's task count on each of its nodes, e.g. (2, 1)
    tasks_layout: str = ""  # srun steps: the same in words, with the hosts ("2 on hpcnode1, 1 on hpcnode2")
    group: int = 0  # replica groups (fault_tolerance.replica_groups): this process's group; rank and world are its
    groups: int = 1  # how many groups the job has (1: no replica groups)

    @property
    def global_rank(self) -> int:
        """The rank's number in the whole job: what its log, progress and error files are named by. Without
        replica groups, its rank; in group g of groups of W ranks, g * W + rank."""
        return self.group * self.world_size + self.rank

    @property
    def global_world(self) -> int:
        """Every rank of the job, over all its replica groups."""
        return self.groups * self.world_size

    @property
    def origin(self) -> str:
        """Who started this process, in words (the `source` for people)."""
        return SOURCE_WORDS.get(self.source, self.source)

    @property
    def uneven(self) -> bool:
        """An srun step with different task counts on its nodes (``--ntasks=3`` over 2 nodes: 2 + 1)."""
        return len(set(self.node_tasks)) > 1

    @property
    def is_distributed(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0


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
    if env.get(LOCAL_LAUNCHER_VARIABLE) != "1":
        return None
    return _torchrun_style(env, "local")


def describe_tasks(counts: Sequence[int], hosts: Sequence[str]) -> str:
    """A step's tasks per node in words: ``2 on hpcnode1, 1 on hpcnode2``; ``4 on each of 64 nodes``.

    `hosts` are the step's nodes in Slurm's order (the order of the counts); without one host per
    count the nodes are named by their index in the step.
    """
    names = list(hosts) if len(hosts) == len(counts) else [f"node {index}" for index in range(len(counts))]
    if len(counts) > 1 and len(set(counts)) == 1:
        return f"{counts[0]} on each of {len(counts)} nodes"
    if len(counts) <= 8:
        return ", ".join(f"{count} on {name}" for count, name in zip(counts, names))
    common, times = Counter(counts).most_common(1)[0]
    others = [f"{count} on {name}" for count, name in zip(counts, names) if count != common]
    shown = ", ".join(others[:4]) + (f" and {len(others) - 4} more" if len(others) > 4 else "")
    return f"{common} on each of {times} nodes, {shown}"


def _from_slurm(env: Mapping[str, str]) -> Optional[RankInfo]:
    if "SLURM_PROCID" not in env or "SLURM_STEP_NUM_TASKS" not in env:
        return None
    world = int(env["SLURM_STEP_NUM_TASKS"])  # the step's tasks; SLURM_NTASKS may be the job's
    rank = int(env["SLURM_PROCID"])
    local_rank = int(env.get("SLURM_LOCALID", "0"))
    step_nodelist = env.get("SLURM_STEP_NODELIST") or ""
    nodelist = step_nodelist or env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST") or "localhost"
    hosts = expand_hostlist(nodelist)  # a malformed list raises HostlistError (a ValueError) naming it
    per_node_name = "SLURM_STEP_TASKS_PER_NODE" if env.get("SLURM_STEP_TASKS_PER_NODE") else "SLURM_TASKS_PER_NODE"
    per_node = env.get(per_node_name) or str(world)
    counts = tasks_per_node(per_node)
    node = int(env.get("SLURM_NODEID", "0"))  # numbered within the step, like the counts
    layout = describe_tasks(counts, hosts if step_nodelist else [])  # the job's nodes may not be the step's
    if sum(counts) != world:
        raise ValueError(
            f"{per_node_name}={per_node} adds up to {sum(counts)} task(s), but SLURM_STEP_NUM_TASKS={world}; this"
            " process's local world size would be a guess"
        )
    if not 0 <= node < len(counts):
        raise ValueError(f"SLURM_NODEID={node}, but {per_node_name}={per_node} lists {len(counts)} node(s)")
    if not (0 <= rank < world and 0 <= local_rank < counts[node]):
        raise ValueError(
            f"SLURM_PROCID={rank} / SLURM_LOCALID={local_rank} do not fit a step of {world} task(s) with"
            f" {counts[node]} on this node ({per_node_name}={per_node}, SLURM_NODEID={node})"
        )
    port = int(env["MASTER_PORT"]) if "MASTER_PORT" in env else port_for_job(env.get("SLURM_JOB_ID", "0"))
    notes = []
    ignored = [key for key in ("RANK", "WORLD_SIZE") if key in env]
    if ignored:
        notes.append(
            f"{' and '.join(ignored)} in the environment ignored: this is an srun step, whose SLURM_PROCID and"
            " SLURM_STEP_NUM_TASKS say the rank"
        )
    if len(set(counts)) > 1:
        notes.append(
            f"this srun step spreads its {world} tasks unevenly ({layout}): local rank {local_rank} of the"
            f" {counts[node]} task(s) on this node, from SLURM_LOCALID and {per_node_name}"
        )
    return RankInfo(
        rank=rank,
        local_rank=local_rank,
        world_size=world,
        local_world_size=counts[node],
        master_addr=env.get("MASTER_ADDR") or hosts[0],
        master_port=port,
        source="srun",
        note="; ".join(notes),
        node_tasks=tuple(counts),
        tasks_layout=layout,
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
            return _in_group(info, env)
    return RankInfo(0, 0, 1, 1, "127.0.0.1", 29500, "single")


def _in_group(info: RankInfo, env: Mapping[str, str]) -> RankInfo:
    """The rank's replica group, when its launcher started it as one (fault_tolerance.replica_groups)."""
    if REPLICA_GROUPS_VARIABLE not in env:
        return info
    group, groups = int(env.get(REPLICA_GROUP_VARIABLE, "0")), int(env[REPLICA_GROUPS_VARIABLE])
    if not 0 <= group < groups:
        raise ValueError(f"{REPLICA_GROUP_VARIABLE}={group} is not a group of {groups}")
    return replace(info, group=group, groups=groups)


def world_mismatch(
    info: RankInfo,
    planned: int,
    env: Optional[Mapping[str, str]] = None,
    most: Optional[int] = None,
    per_node: int = 1,
) -> Optional[str]:
    """Why this process cannot be a rank of a job planned for `planned` ranks, or (a range of nodes) for any multiple
    of `per_node` from `planned` to `most`; None when it can."""
    world = info.world_size
    if world == planned or (most is not None and planned <= world <= most and world % per_node == 0):
        return None
    env = os.environ if env is None else env
    each = f", {per_node} a node," if per_node > 1 else ""
    worlds = str(planned) if most is None else f"{planned} to {most}{each}"
    if info.source == "srun":
        message = (
            f"this job was planned for {worlds} rank(s), but this srun step runs {world} task(s)"
            f" ({info.tasks_layout or 'layout unknown'}); this process is rank {info.rank} of {world}"
        )
    else:
        message = (
            f"this job was planned for {worlds} rank(s), but this process is rank {info.rank} of {world}"
            f" ({info.origin if info.source == 'single' else 'started by ' + info.origin})"
        )
    if info.source == "single" and env.get("SLURM_JOB_ID"):
        fix = (
            f"inside a Slurm allocation start the ranks with srun: srun -n {planned} python -m hpc_train.compute.worker"
            " RUN_DIR/job_config.yaml (a batch script's own shell is one process)."
        )
    elif info.source == "srun":
        fix = (
            f"run the step with {planned} tasks: srun -n {planned} inside an allocation of {planned} tasks (sbatch"
            f" --nodes=N --ntasks-per-node=M with N x M = {planned}"
            + (f"; --ntasks={info.world_size} over several nodes spreads the tasks unevenly" if info.uneven else "")
            + f"), or plan the job for {info.world_size} rank(s) (resources.nodes x resources.gpus_per_node)."
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
