"""Refuse, before queueing, a Slurm request that no node of the partition can ever hold.

Slurm accepts some requests it can never start (a time limit over the partition's MaxTime
pends forever with reason PartitionTimeLimit) and refuses others only at ``sbatch`` time with
a terse message. One ``sinfo`` call gives every node's CPUs, cores, memory and GPUs and every
partition's time limit; comparing the request with them names the key to change and the
numbers that would fit. This is a capacity comparison, not a scheduler: node states, other
jobs, QoS and account limits are left to Slurm. Without an answer from ``sinfo`` nothing is
checked, and a note says why (no Slurm configuration here, a controller that did not answer).
"""

from __future__ import annotations

import functools
import re
import sys
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

from hpc_train.config.checks import count_range
from hpc_train.config.errors import ConfigError
from hpc_train.slurm import slurm_cli
from hpc_train.slurm.slurm_time import slurm_minutes

_FORMAT = "%N|%P|%c|%z|%m|%G|%l"  # node, partition (* = default), CPUs, S:C:T, memory MB, gres, time limit
_GPU = re.compile(r"(?:^|,)gpu(?::[^:,(]+)?:(\d+)")
_MEM = re.compile(r"^(\d+)([KMGT]?)B?$", re.I)
SINFO_TIMEOUT_S = 15  # a configured controller that is slow to answer: the check is skipped after this long


@dataclass(frozen=True)
class Node:
    name: str
    cpus: int
    cores: int  # sockets x cores per socket: what a task counts with --hint=nomultithread
    mem_mb: int
    gpus: int


@dataclass(frozen=True)
class Partition:
    name: str
    default: bool
    max_minutes: Optional[int]  # None: no limit
    nodes: Tuple[Node, ...]


def parse_sinfo(text: str) -> Dict[str, Partition]:
    """``sinfo -h -N -o '%N|%P|%c|%z|%m|%G|%l'`` -> partitions by name (rows it cannot read are skipped)."""
    nodes: Dict[str, List[Node]] = {}
    meta: Dict[str, Tuple[bool, Optional[int]]] = {}
    for line in text.splitlines():
        fields = line.strip().split("|")
        if len(fields) != 7:
            continue
        name, part, cpus, sct, mem, gres, limit = fields
        default = part.endswith("*")
        part = part.rstrip("*")
        try:
            sockets, cores, _threads = (int(x) for x in sct.split(":"))
            node = Node(
                name,
                int(cpus.rstrip("+")),
                sockets * cores,
                int(mem.rstrip("+")),
                sum(int(n) for n in _GPU.findall(gres)),
            )
        except ValueError:
            continue
        if node.name not in {n.name for n in nodes.get(part, [])}:
            nodes.setdefault(part, []).append(node)
        meta[part] = (default, _limit_minutes(limit))
    return {p: Partition(p, meta[p][0], meta[p][1], tuple(n)) for p, n in nodes.items()}


def _limit_minutes(text: str) -> Optional[int]:
    """sinfo's time limit ('infinite', '30:00', '1-00:00:00') -> minutes; None: no limit (or unreadable)."""
    try:
        return slurm_minutes(text)
    except ValueError:
        return None


@dataclass(frozen=True)
class Answer:
    """What ``sinfo`` gave: the partitions, or None and why (``unconfigured``: Slurm has no configuration here)."""

    partitions: Optional[Dict[str, Partition]]
    why: str = ""
    unconfigured: bool = False


@slurm_cli.remembered
def answer() -> Answer:
    """What this cluster's ``sinfo`` says, asked once per command (a sweep asks once; slurm_cli.remembered)."""
    done = slurm_cli.run(["sinfo", "-h", "-N", "-o", _FORMAT], timeout=SINFO_TIMEOUT_S)
    if done.returncode != 0:
        return Answer(None, slurm_cli.said(done), slurm_cli.unconfigured(done))
    found = parse_sinfo(done.stdout)
    return Answer(found) if found else Answer(None, "sinfo listed no nodes")


def partitions() -> Optional[Dict[str, Partition]]:
    """The partitions by name; None when sinfo did not answer (``answer().why`` says why)."""
    return answer().partitions


@functools.lru_cache(maxsize=1)
def note_unchecked(why: str) -> None:
    """Say once per process that the capacity check did not run, and why: a dry run looks fine without it."""
    print(
        f"hpc-train: note: the capacity check could not run ({why}); Slurm checks the request only when it is"
        " submitted.",
        file=sys.stderr,
        flush=True,
    )


@dataclass(frozen=True)
class Keys:
    """The config keys a refusal names: hpc-train's own (the default), or a Hydra app's ``hydra.launcher.*``."""

    nodes: str = "resources.nodes"
    gpus: str = "resources.gpus_per_node"
    cpus: str = "cluster.cpus_per_gpu"  # the key that sets CPUs per task
    cpus_per_gpu: bool = True  # hpc-train asks for CPUs per GPU; a Hydra app, CPUs per task
    mem: str = "cluster.mem_gb"
    partition: str = "cluster.partition"


APP_KEYS = Keys(
    "hydra.launcher.nodes",
    "hydra.launcher.gpus_per_node",
    "hydra.launcher.cpus_per_task",
    False,
    "hydra.launcher.mem_gb",
    "hydra.launcher.partition",
)


def _requested_gpus(params: Dict[str, Any]) -> int:
    if params.get("gpus_per_node") is not None:
        return int(params["gpus_per_node"])
    match = _GPU.search(str(params.get("gres") or ""))
    return int(match.group(1)) if match else 0


def _requested_mem_mb(params: Dict[str, Any]) -> Optional[int]:
    match = _MEM.match(str(params.get("mem") or "").strip())
    if not match:
        return None
    return int(match.group(1)) * {"K": 1 / 1024, "": 1, "M": 1, "G": 1024, "T": 1024**2}[match.group(2).upper()]


def check_capacity(
    params: Dict[str, Any], time_key: str, found: Optional[Dict[str, Partition]] = None, keys: Keys = Keys()
) -> None:
    """Raise ConfigError when no ``nodes`` nodes of the partition can hold this request, or its time is over MaxTime.

    ``params`` are the submitit sbatch parameters (``launch.backends.slurm.params.slurm_parameters``); ``time_key``
    is the config key the time limit came from. ``found`` defaults to what ``sinfo`` answers.
    """
    if found is None:
        found = partitions()
        if found is None:
            note_unchecked(answer().why)
            return
    name = params.get("partition")
    if not found or (name and "," in str(name)):
        return  # no answer from Slurm, or a list of partitions: let Slurm decide
    part = found.get(str(name)) if name else next((p for p in found.values() if p.default), None)
    if part is None or not part.nodes:
        return  # an unknown partition is check_partition's to refuse
    problem = _problem(params, part, time_key, keys)
    if problem is None:
        return
    key, what, fix = problem
    where = f"partition {part.name}" + ("" if name else " (the default)")
    fits = sorted(
        p.name for p in found.values() if p is not part and p.nodes and _problem(params, p, time_key, keys) is None
    )
    other = f", or {keys.partition}={' or '.join(fits)}, where it fits" if fits else ""
    raise ConfigError(key, what.format(where=where), f"{fix}{other}.")


def _fewer(key: str, nodes: int, a_range: bool) -> str:
    """The fix for at most `nodes` nodes: a count, or (resources.nodes=MIN-MAX) a range whose least fits."""
    if not a_range or nodes == 1:
        return f"set {key}={nodes} or fewer"
    return f"set {key}={nodes} or fewer, or a range whose least fits, e.g. {key}={nodes // 2}-{nodes}"


@dataclass(frozen=True)
class _Request:
    """What a job asks of each node, read from its sbatch parameters."""

    nodes: int  # the least it can start on (resources.nodes=2-4: 2)
    most: int  # the most it takes
    gpus: int
    tasks: int
    cpus_per_task: int
    by_core: bool  # --hint=nomultithread (or one thread per core): CPUs are counted in cores
    mem: Any  # the parameter as given ("64G"), for messages
    mem_mb: Optional[int]  # None: the partition's default

    @classmethod
    def of(cls, params: Dict[str, Any]) -> "_Request":
        # A range (resources.nodes=2-4) can start once its least fits: Slurm gives no more nodes than the partition has.
        nodes, most = count_range(params.get("nodes") or 1)
        extra = params.get("additional_parameters") or {}
        by_core = str(extra.get("hint", "")) == "nomultithread" or str(extra.get("threads-per-core", "")) == "1"
        tasks, cpus_per_task = int(params.get("ntasks_per_node") or 1), int(params.get("cpus_per_task") or 1)
        return cls(
            nodes,
            most,
            _requested_gpus(params),
            tasks,
            cpus_per_task,
            by_core,
            params.get("mem"),
            _requested_mem_mb(params),
        )

    @property
    def cpus(self) -> int:
        return self.tasks * self.cpus_per_task

    @property
    def unit(self) -> str:
        return "cores" if self.by_core else "CPUs"

    @property
    def asks(self) -> str:
        return (
            f"at least {self.nodes} nodes ({self.nodes}-{self.most})"
            if self.most > self.nodes
            else f"{self.nodes} nodes"
        )

    def cpus_of(self, node: Node) -> int:
        return node.cores if self.by_core else node.cpus

    def fits(self, node: Node) -> bool:
        return (
            node.gpus >= self.gpus
            and self.cpus_of(node) >= self.cpus
            and (self.mem_mb is None or node.mem_mb >= self.mem_mb)
        )


_Problem = Tuple[str, str, str]  # (key, problem with a {where} slot, fix)


def _problem(params: Dict[str, Any], part: Partition, time_key: str, keys: Keys) -> Optional[_Problem]:
    """(key, problem with a {where} slot, fix) for the first thing the partition's nodes cannot give, or None."""
    asked = _Request.of(params)
    return (
        _too_many_nodes(asked, part, keys)
        or _too_many_gpus(asked, part, keys)
        or _too_many_cpus(asked, part, keys)
        or _too_much_memory(asked, part, keys)
        or _too_few_nodes_that_fit(asked, part, keys)
        or _too_long(int(params["time"]), part, time_key)
    )


def _too_many_nodes(asked: _Request, part: Partition, keys: Keys) -> Optional[_Problem]:
    if asked.nodes <= len(part.nodes):
        return None
    return (
        keys.nodes,
        f"the job asks for {asked.asks}, but {{where}} has {len(part.nodes)}.",
        _fewer(keys.nodes, len(part.nodes), asked.most > asked.nodes),
    )


def _too_many_gpus(asked: _Request, part: Partition, keys: Keys) -> Optional[_Problem]:
    most_gpus = max(n.gpus for n in part.nodes)
    if asked.gpus <= most_gpus:
        return None
    fix = f"set {keys.gpus}={most_gpus} or fewer" if most_gpus else "use a partition with GPUs"
    return (
        keys.gpus,
        f"the job asks for {asked.gpus} GPUs per node, but the nodes of {{where}} have at most {most_gpus}.",
        fix,
    )


def _too_many_cpus(asked: _Request, part: Partition, keys: Keys) -> Optional[_Problem]:
    most_cpus = max(asked.cpus_of(n) for n in part.nodes)
    if asked.cpus <= most_cpus:
        return None
    per_gpu = most_cpus // asked.gpus if asked.gpus else 0
    if not keys.cpus_per_gpu:
        fix = (
            f"set {keys.cpus}={max(1, most_cpus // asked.tasks)} or fewer ({most_cpus} {asked.unit} / {asked.tasks}"
            " task(s) per node)"
        )
    elif per_gpu:
        fix = f"set {keys.cpus}={per_gpu} or fewer ({most_cpus} {asked.unit} / {asked.gpus} GPUs per node)"
    else:
        fix = f"ask for fewer GPUs per node ({keys.gpus})"
    hint = " with --hint=nomultithread" if asked.by_core else ""
    return (
        keys.cpus,
        (
            f"the job asks for {asked.tasks} task(s) x {asked.cpus_per_task} CPUs = {asked.cpus} {asked.unit} per"
            f" node{hint}, but the nodes of {{where}} have at most {most_cpus}."
        ),
        fix,
    )


def _too_much_memory(asked: _Request, part: Partition, keys: Keys) -> Optional[_Problem]:
    most_mem = max(n.mem_mb for n in part.nodes)
    if asked.mem_mb is None or asked.mem_mb <= most_mem:
        return None
    return (
        keys.mem,
        f"the job asks for {asked.mem} per node, but the nodes of {{where}} have at most {most_mem} MB.",
        f"set {keys.mem}={most_mem // 1024} or less, or {keys.mem}=null for the partition's default",
    )


def _too_few_nodes_that_fit(asked: _Request, part: Partition, keys: Keys) -> Optional[_Problem]:
    """Each of GPUs, CPUs and memory fits some node, but not enough nodes have all of them."""
    fitting = sum(1 for n in part.nodes if asked.fits(n))
    if fitting >= asked.nodes:
        return None
    each = f"{asked.gpus} GPUs and {asked.cpus} {asked.unit}" + (
        "" if asked.mem_mb is None else f" and {asked.mem_mb} MB"
    )
    fewer = f"{_fewer(keys.nodes, fitting, asked.most > asked.nodes)}, or " if fitting else ""
    return (
        keys.nodes,
        f"the job asks for {asked.asks} with {each} each, but only {fitting} node(s) of {{where}} have that much.",
        f"{fewer}ask for less per node",
    )


def _too_long(minutes: int, part: Partition, time_key: str) -> Optional[_Problem]:
    if part.max_minutes is None or minutes <= part.max_minutes:
        return None
    return (
        time_key,
        (
            f"{minutes} minutes is longer than {{where}} allows (MaxTime {part.max_minutes} minutes): the job"
            " would pend forever."
        ),
        f"set {time_key}={part.max_minutes} or less",
    )
