"""The job layout each strategy needs, declared in one place.

A layout is what Slurm must allocate (nodes, tasks per node, GPUs per node) and how the
training processes use it (GPUs per task). The Slurm renderer, the local launcher and the
validation all read it from here, so a strategy's shape is never written twice.

G = GPUs per node, N = nodes, S = pipeline/model stages:

=======================  =====  ===============  =======  =================================
strategy                 nodes  tasks per node   gres     notes
=======================  =====  ===============  =======  =================================
single                   1      1                gpu:1
dp                       1      1                gpu:G    one process drives G GPUs
ddp                      N      G                gpu:G    one task per GPU
model_parallel/pipeline  1      1                gpu:G    S = G by default
hybrid                   N      G/S              gpu:G    each task owns S GPUs
pipeline (pipelining)    N      G                gpu:G    one rank per stage
=======================  =====  ===============  =======  =================================
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from hpc_train.launch.errors import ConfigError


@dataclass(frozen=True)
class JobLayout:
    strategy: str
    nodes: int
    tasks_per_node: int
    gpus_per_node: int
    gpus_per_task: int
    cpus_per_task: int

    @property
    def world_size(self) -> int:
        return self.nodes * self.tasks_per_node

    def describe(self) -> str:
        node_word = "node" if self.nodes == 1 else "nodes"
        task_word = "task" if self.tasks_per_node == 1 else "tasks"
        return (
            f"{self.strategy}: {self.nodes} {node_word} x {self.tasks_per_node} {task_word}/node "
            f"(world size {self.world_size}), {self.gpus_per_task} GPU/task, gpu:{self.gpus_per_node} per node, "
            f"{self.cpus_per_task} CPU/task"
        )


@dataclass(frozen=True)
class StrategyShape:
    """How a strategy maps GPUs to processes."""

    multi_node: bool
    one_task_per_gpu: bool  # ddp-like: G tasks per node, 1 GPU each
    gpus_per_task_from_stages: bool  # hybrid: each task owns S GPUs
    single_gpu: bool = False  # `single` always asks for exactly one GPU
    multi_node_hint: str = ""


SINGLE_NODE_HINT = (
    "use strategy=hybrid (pipelined replicas under DDP) or strategy=pipeline strategy.engine=pipelining "
    "to span nodes, or set resources.nodes=1"
)

SHAPES = {
    "single": StrategyShape(False, False, False, single_gpu=True, multi_node_hint="use strategy=ddp to span nodes, or set resources.nodes=1"),
    "dp": StrategyShape(False, False, False, multi_node_hint="use strategy=ddp to span nodes, or set resources.nodes=1"),
    "ddp": StrategyShape(True, True, False),
    "model_parallel": StrategyShape(False, False, False, multi_node_hint=SINGLE_NODE_HINT),
    "pipeline": StrategyShape(False, False, False, multi_node_hint=SINGLE_NODE_HINT),
    "hybrid": StrategyShape(True, False, True),
    "pipeline/pipelining": StrategyShape(True, True, False),
}


def shape_key(strategy: str, engine: Optional[str]) -> str:
    return "pipeline/pipelining" if strategy == "pipeline" and engine == "pipelining" else strategy


def compute_layout(
    strategy: str,
    nodes: int,
    gpus_per_node: int,
    cpus_per_gpu: int = 1,
    stages: Optional[int] = None,
    engine: Optional[str] = None,
) -> JobLayout:
    """Return the layout for a strategy, or raise ConfigError naming the key to change."""
    key = shape_key(strategy, engine)
    if key not in SHAPES:
        raise ConfigError("strategy", f"unknown strategy {strategy!r}.", f"choose one of {', '.join(sorted(set(k.split('/')[0] for k in SHAPES)))}.")
    shape = SHAPES[key]
    if not isinstance(nodes, int) or nodes < 1:
        raise ConfigError("resources.nodes", f"must be a positive integer, got {nodes!r}.", "set resources.nodes=1 or more.")
    if not isinstance(gpus_per_node, int) or gpus_per_node < 1:
        raise ConfigError(
            "resources.gpus_per_node", f"must be a positive integer, got {gpus_per_node!r}.", "set resources.gpus_per_node=1 or more."
        )
    if nodes > 1 and not shape.multi_node:
        raise ConfigError("resources.nodes", f"strategy {strategy} runs inside one node, but resources.nodes={nodes}.", shape.multi_node_hint + ".")
    if shape.single_gpu:
        tasks, gpus_node, gpus_task = 1, 1, 1
    elif shape.one_task_per_gpu:
        tasks, gpus_node, gpus_task = gpus_per_node, gpus_per_node, 1
    elif shape.gpus_per_task_from_stages:
        stages = stages or 2
        if gpus_per_node % stages != 0:
            raise ConfigError(
                "strategy.stages",
                f"hybrid gives each task {stages} GPUs, which does not divide resources.gpus_per_node={gpus_per_node}.",
                f"choose strategy.stages among the divisors of {gpus_per_node}, or change resources.gpus_per_node to a multiple of {stages}.",
            )
        tasks, gpus_node, gpus_task = gpus_per_node // stages, gpus_per_node, stages
    else:
        tasks, gpus_node, gpus_task = 1, gpus_per_node, gpus_per_node
    return JobLayout(
        strategy=strategy if key == strategy else key.replace("/", "+"),
        nodes=nodes,
        tasks_per_node=tasks,
        gpus_per_node=gpus_node,
        gpus_per_task=gpus_task,
        cpus_per_task=max(1, cpus_per_gpu * gpus_task),
    )
