"""Replica groups (``fault_tolerance.replica_groups``): what the keys must agree on, checked before anything is queued.

The groups split the job's data parallelism: each group is a job of its own to torch (its ranks, its strategy), and
torchft averages the gradients across the live groups and restarts a failed one (hpc_train.compute.replicas). So
the job must run hpc_train's own trainer with a data-parallel strategy (ddp, fsdp, mesh), its ranks must split
evenly into the groups (whole nodes a group on Slurm), a replica dimension of the strategy must be the groups
themselves, and torchft must be installed. Each key is checked on its own by its declaration
(``hpc_train.config.fault_tolerance``); the global batch's split over the data-parallel ranks is
``validate.check_trainer``'s, which holds with the groups as without. Login side: neither torch nor torchft is
imported (``find_spec`` of a top-level package imports nothing).
"""

from __future__ import annotations

from importlib.util import find_spec
from pathlib import Path
from typing import Any, List

from hpc_train.config.errors import ConfigError
from hpc_train.config.fault_tolerance import NODE_FIX, TORCHFT_INSTALL, fault_tolerance_node
from hpc_train.config.launcher import launcher_kind
from hpc_train.config.view import ConfigView, plain
from hpc_train.contracts.job_layout import JobLayout
from hpc_train.contracts.replica_plan import replica_plan
from hpc_train.launch.planning.parallelism import Parallelism
from hpc_train.processes.script_command import is_script_job

KEY = "fault_tolerance.replica_groups"
STRATEGIES = ("ddp", "fsdp", "mesh")  # the strategy identities whose data parallelism the groups split
OFF = f"or {KEY}=null (no replica groups)"


def check_replica_groups(cfg: ConfigView, parallel: Parallelism) -> None:
    """Refuse (ConfigError naming the key and the fix) replica groups the job cannot run, and a fault_tolerance node
    that is no mapping of its keys; nothing else is checked when the groups are off."""
    if "fault_tolerance" not in cfg:  # ~fault_tolerance, or a primary config of your own without the node
        return
    node = cfg.fault_tolerance
    problem = fault_tolerance_node(node)
    if problem:
        raise ConfigError("fault_tolerance", f"{problem}.", NODE_FIX)
    if node["replica_groups"] is None:
        return
    groups = int(node["replica_groups"])
    _check_trainer_job(cfg, parallel, groups)
    _check_min_replicas(node, groups)
    _check_launcher(cfg, parallel, groups)
    _check_split(parallel, groups)
    _check_replica_dimension(cfg, parallel, groups)
    if find_spec("torchft") is None:
        raise ConfigError(
            KEY,
            f"{KEY}={groups} runs the groups with torchft (its quorum and recovery), which this Python environment"
            " does not have.",
            f"{TORCHFT_INSTALL} in the environment the job runs in (torchft's wheels are for CPython 3.11 on Linux"
            f" x86-64), {OFF}.",
        )


def _check_trainer_job(cfg: ConfigView, parallel: Parallelism, groups: int) -> None:
    """hpc_train's own trainer, with a strategy whose data parallelism the groups can split."""
    if is_script_job(cfg):
        raise ConfigError(
            KEY,
            f"{KEY}={groups} needs hpc_train's trainer loop (each step's quorum, the gradients averaged across the"
            " groups, a restarted group healed from a live one), but this job runs your own script (script.argv).",
            f"run hpc_train's trainer (drop `-- script ARGS`), or give the script job {KEY}=null.",
        )
    if parallel.layout.strategy not in STRATEGIES:
        raise ConfigError(
            KEY,
            f"{KEY} splits data parallelism into groups, but {parallel.kind.spelling} is not a data-parallel"
            " strategy of one process per GPU.",
            f"use strategy=ddp, fsdp or mesh, {OFF}.",
        )


def _check_min_replicas(node: Any, groups: int) -> None:
    least = int(node["min_replicas"])
    if least > groups:
        raise ConfigError(
            "fault_tolerance.min_replicas",
            f"is {least}, more than the {groups} groups the job has ({KEY}={groups}), so training would never step.",
            f"set fault_tolerance.min_replicas={groups} or less (1: step while one group is live), or raise {KEY}.",
        )


def _check_launcher(cfg: ConfigView, parallel: Parallelism, groups: int) -> None:
    """Slurm: hpc_train starts and restarts the groups itself (not a plain sbatch script), each on whole nodes of a
    fixed node count."""
    kind = launcher_kind(cfg.launcher.name)
    if kind.prepares_only:
        raise ConfigError(
            KEY,
            f"launcher={kind.name} starts every rank with your sbatch script's one srun, but replica groups are"
            " started, watched and restarted one group at a time by hpc-train.",
            f"submit with launcher=slurm, {OFF}.",
        )
    pack = cfg.launcher.get("pack") if "pack" in cfg.launcher else None
    if pack and (pack.get("allocations") if hasattr(pack, "get") else None):
        raise ConfigError(
            KEY,
            f"launcher.pack runs each run as one job step of a shared allocation, but {KEY}={groups} needs the job's"
            " own allocation (a lighthouse, one step per group, spare nodes).",
            f"submit the runs with groups unpacked (launcher.pack.allocations=null), {OFF}.",
        )
    layout = parallel.layout
    if kind.slurm_job and layout.nodes < groups:
        raise ConfigError(
            "resources.nodes",
            f"is {layout.nodes}, fewer than the {groups} groups of {KEY}={groups}: on Slurm each group has whole"
            " nodes of its own, so that a failed node fails one group only.",
            f"set resources.nodes={_multiple(layout.nodes, groups)} (a multiple of {groups}), {OFF}.",
        )
    if layout.max_nodes is not None:
        raise ConfigError(
            "resources.nodes",
            f"{KEY}={groups} gives each group whole nodes of a fixed count, but resources.nodes={layout.nodes_text}"
            " lets Slurm choose the job's node count.",
            f"set resources.nodes=N with N a multiple of {groups} (e.g. resources.nodes="
            f"{_multiple(layout.nodes, groups)}), {OFF}.",
        )
    if kind.slurm_job and layout.nodes > 1 and layout.nodes % groups:
        raise ConfigError(
            "resources.nodes",
            f"{layout.nodes} nodes do not split into {KEY}={groups} groups of whole nodes (a group's ranks share its"
            " nodes, so that a failed node fails one group only).",
            f"set resources.nodes to a multiple of {groups} (e.g. resources.nodes={_multiple(layout.nodes, groups)}),"
            f" or {KEY}={_among(_divisors(layout.nodes, least=2))}, {OFF}.",
        )


def _check_split(parallel: Parallelism, groups: int) -> None:
    """Each group holds the same share of the job's data-parallel ranks (all its ranks for ddp and fsdp)."""
    layout = parallel.layout
    world, data_parallel = layout.world_size, parallel.data_parallel_size
    if data_parallel >= groups and data_parallel % groups == 0:
        return
    ranks = f"{data_parallel} rank" if data_parallel == 1 else f"{data_parallel} ranks"
    if data_parallel == world:
        what = f"the job's {ranks} ({layout.describe()})"
    else:  # a mesh whose tp or pp ranks share each batch share
        what = f"the job's {ranks} of data parallelism (dp_replicate x dp_shard of {layout.describe()})"
    if data_parallel < groups:
        verb = "is" if data_parallel == 1 else "are"
        problem = f"{verb} fewer than the {groups} groups of {KEY}={groups} (a group has one rank or more)"
    else:
        problem = f"do not split evenly into {KEY}={groups} groups"
    fits = _divisors(data_parallel, least=2)
    choice = f"set {KEY}={_among(fits)}, or " if fits else ""
    raise ConfigError(
        KEY,
        f"{what} {problem}.",
        f"{choice}change resources.nodes / resources.gpus_per_node so that a multiple of {groups} ranks split each"
        f" batch, {OFF}.",
    )


def _check_replica_dimension(cfg: ConfigView, parallel: Parallelism, groups: int) -> None:
    """A strategy's own replicas (mesh's dp_replicate, fsdp's HSDP replicate) are the groups when both are given."""
    layout = parallel.layout
    if layout.strategy == "mesh" and parallel.dims is not None:
        replicas = parallel.dims.dp_replicate
        if replicas not in (1, groups):
            raise ConfigError(
                "strategy.dp_replicate",
                f"is {replicas}, but {KEY}={groups}: the groups are the job's data replicas, and giving both"
                f" strategy.dp_replicate and {KEY} is refused unless they agree.",
                f"drop strategy.dp_replicate (1: the groups replicate), or set strategy.dp_replicate={groups}, or set"
                f" {KEY}={replicas}.",
            )
    if layout.strategy == "fsdp" and layout.mesh is not None:
        replicas = int(layout.mesh[0])
        given = cfg.strategy.get("replicate")
        if replicas not in (1, groups):
            spelled = f"{given} ({replicas} replicas)" if str(given) != str(replicas) else str(given)
            raise ConfigError(
                "strategy.replicate",
                f"is {spelled}, but {KEY}={groups}: the groups are the job's HSDP replicas, and giving both"
                f" strategy.replicate and {KEY} is refused unless they agree.",
                f"set strategy.replicate=1 (each group shards over its own ranks) or strategy.replicate={groups}, or"
                f" set {KEY}={replicas}.",
            )


def _divisors(count: int, least: int = 1) -> List[int]:
    return [n for n in range(least, count + 1) if count % n == 0]


def _multiple(count: int, groups: int) -> int:
    """The multiple of `groups` nearest above `count` (at least `groups`)."""
    return max(groups, -(-count // groups) * groups)


def _among(values: List[int]) -> str:
    """`values` as a choice of the fix (`2, 3 or 6`; the first six)."""
    shown = [str(v) for v in values[:6]]
    return shown[0] if len(shown) == 1 else f"{', '.join(shown[:-1])} or {shown[-1]}"


def say_groups(cfg: ConfigView, layout: JobLayout, run_dir: Path, slurm: bool) -> None:
    """Under the layout line of a dry run or a start: the replica groups, when the job has them."""
    node = plain(cfg.get("fault_tolerance"))
    if node and node.get("replica_groups"):
        print(f"hpc-train: {replica_plan(layout, node, run_dir).launch_line(layout.nodes, slurm)}")
