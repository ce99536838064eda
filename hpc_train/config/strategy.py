"""The strategy group: the parallelism strategy and its settings; ``only`` names the strategies each applies to."""

from __future__ import annotations

from typing import Any, Optional, Tuple

from hpc_train.config.checks import balance, flag, list_of, one_of, replicate, split_point, whole
from hpc_train.config.rule import R, Rule

NAMES = ("single", "dp", "ddp", "fsdp", "model_parallel", "pipeline", "hybrid")  # the options of the strategy group


ENGINE_DEFAULT = "native"  # strategy.engine when left out: one process owns all stages
HYBRID_STAGES = 2  # hybrid's strategy.stages when null without split_points: each task owns two GPUs


def strategy_id(strategy: Any) -> str:
    """The identity of a `strategy` config node (what users type -> one name): `pipeline` with
    ``engine=pipelining`` is its own strategy (one rank a stage), every other name is itself."""
    name = str(strategy.get("name"))
    if name == "pipeline" and str(strategy.get("engine", ENGINE_DEFAULT)) == "pipelining":
        return "pipelining"
    return name


def micro_batches(chunks: Optional[Any]) -> int:
    """strategy.chunks as a count: null, or a strategy without the key (model_parallel), is one micro-batch."""
    return 1 if chunks is None else int(chunks)


RULES: Tuple[Rule, ...] = (
    R(
        "strategy.name",
        one_of(*NAMES),
        "ddp",
        required=True,
        fix=f"pick the strategy with strategy={'|'.join(NAMES)}.",
        doc="The parallelism strategy (pick it with strategy=NAME).",
    ),
    R(
        "strategy.stages",
        whole(1),
        2,
        null=f"one stage per GPU of the task (hybrid: {HYBRID_STAGES}), or len(split_points) + 1",
        doc=f"Stages the model is cut into; null: one per GPU of the task (2 on CPUs; hybrid: {HYBRID_STAGES}), or len(split_points) + 1.",
        default=None,
        only=("model_parallel", "pipeline", "hybrid", "pipelining"),
    ),
    R(
        "strategy.chunks",
        whole(1),
        4,
        null="one micro-batch",
        doc="Micro-batches per step (must divide the per-rank batch); null: one.",
        default=4,
        only=("pipeline", "hybrid", "pipelining"),
    ),
    R(
        "strategy.balance",
        balance,
        "params",
        fix="use strategy.balance=params, strategy.balance=time or layer counts such as strategy.balance=[5,10].",
        doc="How layers are shared among stages: params | time (measured) | [layer counts].",
        default="params",
        only=("model_parallel", "pipeline", "hybrid", "pipelining"),
    ),
    R(
        "strategy.batchnorm",
        one_of("keep", "freeze"),
        "keep",
        fix="use strategy.batchnorm=keep or strategy.batchnorm=freeze.",
        doc="keep: batch-norm statistics per micro-batch | freeze: running statistics (eval mode).",
        default="keep",
        only=("model_parallel", "pipeline", "hybrid", "pipelining"),
    ),
    R(
        "strategy.engine",
        one_of("native", "pipelining"),
        "native",
        fix="use strategy.engine=native (one process, single node) or strategy.engine=pipelining (one rank per stage).",
        doc="native: one process owns all stages (single node) | pipelining: one rank per stage (torch.distributed.pipelining, spans nodes).",
        default=ENGINE_DEFAULT,
        only=("pipeline", "pipelining"),
    ),
    R(
        "strategy.schedule",
        one_of("gpipe", "1f1b", normalize=str.lower),
        "gpipe",
        fix="use strategy.schedule=gpipe or strategy.schedule=1f1b.",
        doc="engine=pipelining: gpipe | 1f1b (1f1b needs chunks >= stages).",
        default="gpipe",
        only=("pipelining",),
    ),
    R(
        "strategy.split_points",
        list_of(split_point, "module names", allow_empty=False),
        "[layer3]",
        null="cut automatically",
        fix=(
            "e.g. strategy.split_points=[layer3] or strategy.split_points=[features.4,head] (names as in"
            " model.named_modules()); null to cut automatically."
        ),
        doc="Module names (as in named_modules()) where a new stage begins; null: cut automatically.",
        default=None,
        only=("model_parallel", "pipeline", "hybrid", "pipelining"),
    ),
    R(
        "strategy.backend",
        one_of("auto", "nccl", "gloo", "mpi", "ucc"),
        "auto",
        fix="use strategy.backend=auto (nccl on GPUs, gloo on CPUs), nccl or gloo.",
        doc="The process group's backend; auto: nccl on GPUs, gloo on CPUs.",
        default="auto",
    ),
    R(
        "strategy.find_unused_parameters",
        flag,
        "false",
        fix="use strategy.find_unused_parameters=true or false.",
        doc="DDP's find_unused_parameters (for models that skip parameters in some steps).",
        default=False,
        only=("ddp", "hybrid"),
    ),
    R(
        "strategy.replicate",
        replicate,
        "nodes",
        fix=(
            "use strategy.replicate=1 (shard over all ranks), strategy.replicate=nodes (HSDP: shard inside a node,"
            " replicate across nodes) or a number of replicas."
        ),
        doc="1: shard over all ranks | nodes: HSDP, shard inside a node, replicate across nodes | R: R replicas.",
        default=1,
        only=("fsdp",),
    ),
    R(
        "strategy.reshard_after_forward",
        flag,
        "true",
        fix="use strategy.reshard_after_forward=true or false.",
        doc="true: free gathered parameters after forward (ZeRO-3) | false: keep them until backward (more memory).",
        default=True,
        only=("fsdp",),
    ),
    R(
        "strategy.cpu_offload",
        flag,
        "false",
        fix="use strategy.cpu_offload=true or false.",
        doc="Keep the sharded parameters, gradients and optimizer state in CPU memory (CPUOffloadPolicy).",
        default=False,
        only=("fsdp",),
    ),
    R(
        "strategy.wrap",
        list_of(split_point, "module names", allow_empty=False),
        "[layer1,layer2]",
        null="each block of the model's repeated block list",
        fix="give module names as in model.named_modules(), e.g. strategy.wrap=[encoder,decoder], or strategy.wrap=null.",
        doc="Modules sharded as units; null: each block of the model's repeated block list (else each child holding parameters).",
        default=None,
        only=("fsdp",),
    ),
)
