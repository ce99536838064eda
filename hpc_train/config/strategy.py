"""The strategy group: the parallelism strategy and its settings; ``only`` names the strategies each applies to."""

from __future__ import annotations

from typing import Any, Optional, Tuple

from hpc_train.config.checks import (
    Problem,
    balance,
    flag,
    list_of,
    number,
    one_of,
    replicate,
    show,
    split_point,
    text,
    whole,
)
from hpc_train.config.rule import R, Rule

NAMES = ("single", "dp", "ddp", "fsdp", "model_parallel", "pipeline", "hybrid", "mesh", "auto")  # the group's options
AUTO = "auto"  # hpc-train chooses the layout (hpc_train.launch.planning.auto_layout), then runs one of the others
AUTO_SEARCH = ("ddp", "fsdp", "hsdp", "tp", "pp")  # the kinds of layout strategy=auto may try
TP_STYLES = ("colwise", "rowwise", "colwise_gather")  # what a strategy.tp_plan pattern may map to, besides a _target_


ENGINE_DEFAULT = "native"  # strategy.engine when left out: one process owns all stages
HYBRID_STAGES = 2  # hybrid's strategy.stages when null without split_points: each task owns two GPUs


def strategy_id(strategy: Any) -> str:
    """The identity of a `strategy` config node (what users type -> one name): `pipeline` with
    ``engine=pipelining`` is its own strategy (one rank a stage), every other name is itself."""
    name = str(strategy.get("name"))
    if name == "pipeline" and str(strategy.get("engine", ENGINE_DEFAULT)) == "pipelining":
        return "pipelining"
    return name


def tp_plan(value: Any) -> Problem:
    """strategy.tp_plan: {module-name pattern: style or {_target_: fn}}, or {_target_: fn} for the whole plan."""
    if value is None:
        return None
    if not hasattr(value, "items") or not len(value):
        styles = ", ".join(TP_STYLES)
        return f"must be a mapping of module-name patterns to {styles} or {{_target_: ...}}, got {show(value)}"
    if "_target_" in value:
        return None if isinstance(value["_target_"], str) else f"has a _target_ that is not a name: {show(value)}"
    for pattern, style in value.items():
        if isinstance(pattern, int) and not isinstance(pattern, bool) and pattern >= 0:
            pattern = str(pattern)  # an nn.Sequential's children are named by digits, which Hydra reads as numbers
        if not isinstance(pattern, str) or not pattern:
            return f"has the pattern {show(pattern)}, which is not a module-name pattern such as layers.*.attn.wq"
        if hasattr(style, "items"):
            if not isinstance(style.get("_target_"), str):
                return f"maps {pattern!r} to {show(style)}, which has no _target_ naming a function (module, tp_mesh)"
        elif style not in TP_STYLES:
            return f"maps {pattern!r} to {show(style)}; a pattern maps to {', '.join(TP_STYLES)} or {{_target_: ...}}"
    return None


tp_plan.what = f"mapping: pattern -> {' | '.join(TP_STYLES)} | {{_target_: fn}}"  # type: ignore[attr-defined]


def shard_degree(value: Any) -> Problem:
    if value == -1:
        return None
    return whole(1)(value) and f"must be -1 (whatever the world leaves) or a positive whole number, got {show(value)}"


shard_degree.what = "-1 or whole number >= 1"  # type: ignore[attr-defined]


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
        doc=(
            f"Stages the model is cut into; null: one per GPU of the task (2 on CPUs; hybrid: {HYBRID_STAGES}), or "
            "len(split_points) + 1."
        ),
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
        only=("pipeline", "hybrid", "pipelining", "mesh"),
    ),
    R(
        "strategy.balance",
        balance,
        "params",
        fix="use strategy.balance=params, strategy.balance=time or layer counts such as strategy.balance=[5,10].",
        doc="How layers are shared among stages: params | time (measured) | [layer counts].",
        default="params",
        only=("model_parallel", "pipeline", "hybrid", "pipelining", "mesh"),
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
        doc=(
            "native: one process owns all stages (single node) | pipelining: one rank per stage "
            "(torch.distributed.pipelining, spans nodes)."
        ),
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
        only=("pipelining", "mesh"),
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
        only=("model_parallel", "pipeline", "hybrid", "pipelining", "mesh"),
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
        fix=(
            "give module names as in model.named_modules(), e.g. strategy.wrap=[encoder,decoder], or "
            "strategy.wrap=null."
        ),
        doc=(
            "Modules sharded as units; null: each block of the model's repeated block list (else each child holding "
            "parameters)."
        ),
        default=None,
        only=("fsdp",),
    ),
    R(
        "strategy.dp_replicate",
        whole(1),
        2,
        doc="mesh: data-parallel replicas (DDP-like between them; HSDP's outer dimension when dp_shard > 1).",
        default=1,
        only=("mesh",),
    ),
    R(
        "strategy.dp_shard",
        shard_degree,
        -1,
        fix="set strategy.dp_shard=-1 (whatever the world leaves) or a shard degree such as strategy.dp_shard=2.",
        doc="mesh: FSDP2 shard degree; -1: whatever the world leaves (world / (dp_replicate x tp x pp)).",
        default=-1,
        only=("mesh",),
    ),
    R(
        "strategy.tp",
        whole(1),
        2,
        doc="mesh: tensor-parallel degree, inside a node (divides the GPUs per node); needs strategy.tp_plan.",
        default=1,
        only=("mesh",),
    ),
    R(
        "strategy.pp",
        whole(1),
        2,
        doc="mesh: pipeline stages, one rank each (torch.distributed.pipelining), the outermost dimension.",
        default=1,
        only=("mesh",),
    ),
    R(
        "strategy.tp_plan",
        tp_plan,
        "{layers.*.attn.wq: colwise, layers.*.attn.wo: rowwise}",
        null="no tensor-parallel plan (only with strategy.tp=1)",
        fix=(
            "give a mapping of module-name patterns (fnmatch over model.named_modules()) to colwise, rowwise or"
            ' colwise_gather, e.g. in your strategy option: tp_plan: {"layers.*.attn.wq": colwise,'
            ' "layers.*.attn.wo": rowwise}, or {_target_: mypkg.plan} naming a function (model, tp_mesh).'
        ),
        doc=(
            "mesh: the tensor-parallel plan: {module-name pattern: colwise | rowwise | colwise_gather | "
            "{_target_: fn}},"
            " or {_target_: fn} called as fn(model, tp_mesh)."
        ),
        default=None,
        only=("mesh",),
        mapping=True,
    ),
    R(
        "strategy.mesh",
        text(r"[A-Za-z0-9_][A-Za-z0-9_./-]*", "a strategy option's name"),
        "llama_tp",
        doc="auto: the strategy option (a mesh) its tensor-parallel and pipeline candidates select, with its tp_plan.",
        default="mesh",
        only=(AUTO,),
    ),
    R(
        "strategy.search",
        list_of(one_of(*AUTO_SEARCH), "layout kinds", allow_empty=False),
        "[fsdp,tp]",
        fix=f"list the kinds of layout to try among {', '.join(AUTO_SEARCH)}, e.g. strategy.search=[fsdp,tp].",
        doc=f"auto: the kinds of layout tried: {' | '.join(AUTO_SEARCH)} (hsdp: on several nodes).",
        default=list(AUTO_SEARCH),
        only=(AUTO,),
    ),
    R(
        "strategy.efficiency",
        number(0, 1, low_open=True),
        0.4,
        doc="auto: the share of the device's peak FLOP/s a training step sustains, in the modelled step time.",
        default=0.4,
        only=(AUTO,),
    ),
)
