"""Every strategy's identity, spelling and job shape: the one table both sides read (no torch).

Users pick a strategy with ``strategy=<name>`` (and, for the distributed pipeline,
``strategy.engine=pipelining``); :func:`hpc_train.config.strategy.strategy_id` turns that into one identity, which the
launch side lays out (hpc_train.launch.planning.layout) and validates, and the compute side builds
(hpc_train.compute.parallel). G = GPUs per node, N = nodes, S = stages:

============== ========================================= ===== ============== ===================
identity       what users type                           nodes tasks per node GPUs per task
============== ========================================= ===== ============== ===================
single         strategy=single                           1     1              1
dp             strategy=dp                               1     1              G
ddp            strategy=ddp                              N     G              1
fsdp           strategy=fsdp                             N     G              1 (parameters sharded)
model_parallel strategy=model_parallel                   1     1              G (S = G default)
pipeline       strategy=pipeline                         1     1              G (S = G default)
hybrid         strategy=hybrid                           N     G/S            S
pipelining     strategy=pipeline strategy.engine=pipelining N  G              1 (one rank a stage)
mesh           strategy=mesh                             N     G              1 (pp x dp x tp ranks)
============== ========================================= ===== ============== ===================
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, List, Optional, Tuple, Union

from hpc_train.config import default_of
from hpc_train.config.strategy import micro_batches, strategy_id


@dataclass(frozen=True)
class StrategyKind:
    id: str
    spelling: str  # how users select it
    multi_node: bool  # may span nodes
    one_task_per_gpu: bool  # G tasks per node, 1 GPU each (ddp-like)
    gpus_per_task_from_stages: bool  # each task owns S GPUs (hybrid)
    staged: bool = False  # the model is cut into stages (split_points, balance, chunks, ...)
    single_gpu: bool = False  # always exactly one GPU
    sharded: bool = (
        False  # parameters sharded over ranks (torch.distributed.checkpoint checkpoints, any world on resume)
    )
    multi_node_hint: str = ""  # the fix when resources.nodes > 1 is refused
    one_process: bool = False  # one process drives the node's GPUs: a script job sees what `python script.py` sees
    any_world: bool = False  # its single-file checkpoint (one replica's state) resumes at any number of ranks
    # each rank holds a share of the model (FSDP shards, tensor-parallel slices, a pipeline stage a rank), not all of
    # it: the memory estimate's floor is the largest rank's even share (hpc_train.compute.fit.floor)
    ranks_share_model: bool = False


_ONE_NODE = (
    "use strategy=hybrid (pipelined replicas under DDP) or strategy=pipeline strategy.engine=pipelining to span nodes,"
    " or set resources.nodes=1"
)
_USE_DDP = "use strategy=ddp to span nodes, or set resources.nodes=1"

KINDS = {
    kind.id: kind
    for kind in (
        StrategyKind(
            "single",
            "strategy=single",
            False,
            False,
            False,
            single_gpu=True,
            multi_node_hint=_USE_DDP,
            one_process=True,
        ),
        StrategyKind("dp", "strategy=dp", False, False, False, multi_node_hint=_USE_DDP, one_process=True),
        StrategyKind("ddp", "strategy=ddp", True, True, False, any_world=True),
        StrategyKind("fsdp", "strategy=fsdp", True, True, False, sharded=True, ranks_share_model=True),
        StrategyKind(
            "model_parallel",
            "strategy=model_parallel",
            False,
            False,
            False,
            staged=True,
            multi_node_hint=_ONE_NODE,
            one_process=True,
        ),
        StrategyKind(
            "pipeline",
            "strategy=pipeline",
            False,
            False,
            False,
            staged=True,
            multi_node_hint=_ONE_NODE,
            one_process=True,
        ),
        StrategyKind("hybrid", "strategy=hybrid", True, False, True, staged=True),
        StrategyKind(
            "pipelining",
            "strategy=pipeline strategy.engine=pipelining",
            True,
            True,
            False,
            staged=True,
            ranks_share_model=True,
        ),
        StrategyKind("mesh", "strategy=mesh", True, True, False, sharded=True, ranks_share_model=True),
    )
}


def kind_of(strategy: Any) -> Optional[StrategyKind]:
    return KINDS.get(strategy_id(strategy))


def fsdp_mesh(strategy: Any, nodes: int, tasks_per_node: int) -> Tuple[int, int]:
    """(replicas, shards) of an fsdp job: `strategy.replicate` 1 shards over all ranks, `nodes` shards inside a node
    and replicates across nodes (HSDP), R makes R replicas of W / R shards (validated on the login side)."""
    replicate = strategy.get("replicate", default_of("strategy.replicate"))
    world = nodes * tasks_per_node
    replicas = nodes if str(replicate) == "nodes" else int(replicate)
    return replicas, world // max(1, replicas)


@dataclass(frozen=True)
class SplitSettings:
    """The settings of the strategies that cut the model, read from a completed strategy node."""

    stages: Optional[int]  # declared stages: len(split_points) + 1, else strategy.stages (None: from the GPUs)
    split_points: List[str]  # module names where a stage begins ([]: cut automatically)
    chunks: int  # micro-batches per step
    balance: Union[str, List[int]]  # params | time | layer counts
    batchnorm: str  # keep | freeze
    schedule: Optional[str]  # gpipe | 1f1b (the pipelining engine's; None for the others)


def split_settings(strategy: Any) -> SplitSettings:
    """The node's values as the declarations completed them (``hpc_train.config.engine.complete``): no defaults here."""
    points = [str(p) for p in strategy["split_points"] or []]
    balance = strategy["balance"]
    stages = len(points) + 1 if points else (int(strategy["stages"]) if strategy["stages"] else None)
    schedule = strategy.get("schedule")  # declared for the pipelining engine only
    return SplitSettings(
        stages=stages,
        split_points=points,
        chunks=micro_batches(strategy.get("chunks")),
        balance=balance if isinstance(balance, str) else [int(c) for c in balance],
        batchnorm=str(strategy["batchnorm"]),
        schedule=None if schedule is None else str(schedule).lower(),
    )


def mesh_split_settings(strategy: Any, stages: int) -> SplitSettings:
    """A mesh's pipeline settings (pp > 1): its stages are strategy.pp; batch norm keeps per-micro-batch statistics."""
    points = [str(p) for p in strategy["split_points"] or []]
    balance = strategy["balance"]
    return SplitSettings(
        stages=stages,
        split_points=points,
        chunks=micro_batches(strategy.get("chunks")),
        balance=balance if isinstance(balance, str) else [int(c) for c in balance],
        batchnorm="keep",
        schedule=str(strategy["schedule"]).lower(),
    )
