"""The trainer group (conf/trainer/default.yaml): every key is read by the training loop."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Tuple

from hpc_train.config.checks import (
    Problem,
    auto_or,
    flag,
    name_or_target,
    number,
    one_of,
    ranks_or_all,
    show,
    step_range,
    target_node,
    typed,
    whole,
)
from hpc_train.config.rule import R, Rule
from hpc_train.records import hang

PRECISIONS = ("32", "bf16", "16")
# trainer.hang_timeout_s=auto, in words, from the constants hang.timeout_s computes it with
HANG_AUTO = f"max({hang.AUTO_FLOOR_S:g} s, {hang.AUTO_STEPS} median steps)"

# trainer.profile's keys: declared one by one, and the node itself, so that a value that is no mapping
# (trainer.profile=0) is refused naming it and a trainer option without the node runs with the keys' defaults.
PROFILE_RULES: Tuple[Rule, ...] = (
    R(
        "trainer.profile.steps",
        step_range,
        "[10,12]",
        null="no profile",
        fix="set e.g. trainer.profile.steps=[10,12] (the first and last global step profiled, from 1), or null.",
        doc="Profile these global steps, first to last inclusive, with torch.profiler: a trace per chosen rank in"
        " <run dir>/profile/; null: no profile.",
        default=None,
    ),
    R(
        "trainer.profile.ranks",
        ranks_or_all,
        "[0]",
        fix="set e.g. trainer.profile.ranks=[0] or trainer.profile.ranks=[0,3], or trainer.profile.ranks=all.",
        doc="The ranks that write a trace of trainer.profile.steps: a list, or all.",
        default=[0],
    ),
    R(
        "trainer.profile.memory",
        flag,
        "true",
        doc="GPUs: also record the CUDA allocator's history and write a memory snapshot beside each trace.",
        default=False,
    ),
)
PROFILE_KEYS = tuple(rule.key.rsplit(".", 1)[1] for rule in PROFILE_RULES)


def profile_node(value: Any) -> Problem:
    """trainer.profile: a mapping of PROFILE_KEYS (each key checked by its own rule)."""
    if not isinstance(value, Mapping):
        return f"must be a mapping of {', '.join(PROFILE_KEYS)}, got {show(value)}"
    unknown = [str(k) for k in value if k not in PROFILE_KEYS]
    return f"has no key {unknown[0]!r} (it has {', '.join(PROFILE_KEYS)})" if unknown else None


PROFILE_NODE = R(
    "trainer.profile",
    typed(f"mapping of {', '.join(PROFILE_KEYS)}", profile_node),
    "{steps: [10,12]}",
    fix="set e.g. trainer.profile.steps=[10,12] (and trainer.profile.ranks, trainer.profile.memory), or leave"
    " trainer.profile out (no profile).",
    doc="torch.profiler traces of chosen steps and ranks (the keys below); a trainer option without it is not"
    " profiled.",
    default={rule.key.rsplit(".", 1)[1]: rule.default for rule in PROFILE_RULES},
)

RULES: Tuple[Rule, ...] = (
    R(
        "trainer.batch_size",
        whole(1),
        64,
        required=True,
        doc="The global batch per optimizer step; each of W data-parallel ranks gets batch_size / W.",
    ),
    R(
        "trainer.epochs",
        whole(1),
        1,
        null="train for trainer.max_steps",
        required=True,
        fix="set trainer.epochs=1 or more, or trainer.epochs=null with trainer.max_steps set.",
        doc="Full passes over the training set; null: train for max_steps.",
    ),
    R(
        "trainer.max_steps",
        whole(1),
        1000,
        null="train for trainer.epochs",
        required=True,
        fix="set trainer.max_steps=1 or more, or null to train for trainer.epochs.",
        doc="Stop after this many optimizer steps (caps epochs when both are set); null: train for epochs.",
    ),
    R(
        "trainer.optimizer",
        name_or_target("sgd", "adamw"),
        "sgd",
        required=True,
        fix=(
            "use trainer.optimizer=sgd or adamw, or a partial optimizer class, e.g."
            " trainer.optimizer={_target_: torch.optim.AdamW, _partial_: true, betas: [0.9, 0.95]}."
        ),
        doc=(
            "sgd | adamw | a partial optimizer class, called as f(param_groups, lr=trainer.lr, "
            "weight_decay=trainer.weight_decay)."
        ),
        mapping=True,
    ),
    R(
        "trainer.param_groups",
        name_or_target("single", "no_decay_1d"),
        "no_decay_1d",
        fix=(
            "use trainer.param_groups=single (every parameter decayed), no_decay_1d (no weight decay on biases, norm"
            " weights and other 1-D parameters), or {_target_: my_package.groups, _partial_: true}, a function"
            " groups(model) -> list of dicts."
        ),
        doc=(
            "single | no_decay_1d (no weight decay on biases, norm weights, 1-D parameters) | a partial function "
            "groups(model)."
        ),
        default="single",
        mapping=True,
    ),
    R("trainer.lr", number(0, low_open=True), 0.05, required=True, doc="The peak learning rate."),
    R(
        "trainer.min_lr",
        number(0),
        0.0,
        fix="set e.g. trainer.min_lr=1e-4 (the floor of the cosine schedule; 0: none).",
        doc="The floor the cosine schedule decays to.",
        default=0.0,
    ),
    R("trainer.momentum", number(0, 1), 0.9, required=True, doc="SGD momentum (sgd only)."),
    R("trainer.weight_decay", number(0), 0.0005, required=True, doc="Weight decay (of the decayed parameter groups)."),
    R(
        "trainer.lr_schedule",
        name_or_target("constant", "cosine", "step"),
        "cosine",
        required=True,
        fix=(
            "use one of: constant, cosine, step, or a partial torch.optim.lr_scheduler class, e.g."
            " trainer.lr_schedule={_target_: torch.optim.lr_scheduler.OneCycleLR, _partial_: true, max_lr: 0.1,"
            " total_steps: 1000}."
        ),
        doc="constant | cosine | step | a partial torch.optim.lr_scheduler class, stepped every optimizer step.",
        mapping=True,
    ),
    R(
        "trainer.lr_schedule_steps",
        whole(1),
        2000,
        null="the run's own length (trainer.max_steps, or its epochs' steps)",
        fix="set trainer.lr_schedule_steps=1 or more (the steps the schedule spans), or null for the run's length.",
        doc=(
            "The steps the built-in schedule spans (cosine decays over them), wherever the run stops: a run stopped"
            " early and resumed with a larger trainer.max_steps keeps its schedule; null: the run's length."
        ),
        default=None,
    ),
    R(
        "trainer.lr_warmup_steps",
        whole(0),
        0,
        required=True,
        doc="Linear warm-up steps before the schedule (built-in schedules only).",
    ),
    R(
        "trainer.lr_step_every",
        whole(1),
        1000,
        required=True,
        doc="step schedule: multiply the learning rate by lr_step_gamma every this many steps.",
    ),
    R(
        "trainer.lr_step_gamma",
        number(0, 1, low_open=True),
        0.1,
        required=True,
        doc="step schedule: the factor applied every lr_step_every steps.",
    ),
    R(
        "trainer.loss",
        target_node,
        "torch.nn.CrossEntropyLoss",
        required=True,
        fix=(
            "set trainer.loss._target_=torch.nn.CrossEntropyLoss (a loss class), or a function with"
            " trainer.loss._partial_=true."
        ),
        doc="The loss: a class (instantiated) or a function with _partial_: true.",
        mapping=True,
    ),
    R(
        "trainer.step",
        target_node,
        "hpc_train.steps.model_loss",
        null="the built-in step: trainer.loss of the model's output against the target",
        fix=(
            "set trainer.step={_target_: my_package.step, _partial_: true} (a function step(model, batch) returning the"
            " loss), trainer.step._target_=hpc_train.steps.model_loss for a model that computes its own loss, or"
            " trainer.step=null."
        ),
        doc=(
            "null: loss(model(input), target) on (input, target) pairs | a partial function step(model, batch) "
            "returning the loss (or a dict with loss and metrics)."
        ),
        default=None,
        mapping=True,
    ),
    R(
        "trainer.precision",
        one_of(*PRECISIONS, normalize=str.lower, ints=True),
        "bf16",
        required=True,
        fix="use trainer.precision=32, trainer.precision=bf16 or trainer.precision=16.",
        doc='"32" | bf16 | "16" (16 uses a gradient scaler).',
    ),
    R(
        "trainer.channels_last",
        flag,
        "false",
        required=True,
        doc="Convert the model and images to channels-last memory format.",
    ),
    R(
        "trainer.activation_checkpointing",
        one_of("none", "blocks"),
        "blocks",
        fix="use trainer.activation_checkpointing=none or trainer.activation_checkpointing=blocks.",
        doc="none | blocks: recompute each block's activations in backward (single, dp, ddp, fsdp).",
        default="none",
    ),
    R("trainer.compile", flag, "false", required=True, doc="torch.compile the model (where the strategy allows it)."),
    R(
        "trainer.grad_clip",
        number(0, low_open=True),
        1.0,
        null="gradients are not clipped",
        fix="set e.g. trainer.grad_clip=1.0 (the largest total L2 norm of the gradients), or null (no clipping).",
        doc="Clip the gradients' total L2 norm to this; null: no clipping (grad_norm is logged either way).",
        default=None,
    ),
    R(
        "trainer.grad_accum_steps",
        whole(1, 1_000_000),
        4,
        fix="set trainer.grad_accum_steps=1 (no accumulation) or more (micro-batches per optimizer step).",
        doc="Micro-batches per optimizer step: each rank's share of batch_size is cut into this many.",
        default=1,
    ),
    R("trainer.eval", flag, "true", required=True, doc="Evaluate on the validation split."),
    R(
        "trainer.eval_every",
        whole(1),
        500,
        null="evaluate after every epoch",
        fix="set e.g. trainer.eval_every=500 (optimizer steps between evaluations), or null (after every epoch).",
        doc="Optimizer steps between evaluations (and one at the end); null: after every epoch.",
        default=None,
    ),
    R(
        "trainer.eval_batches",
        whole(1),
        20,
        null="the whole validation split",
        fix="set e.g. trainer.eval_batches=20 (the first batches of the validation split), or null (all of it).",
        doc="Evaluate on the first N batches of the validation split (the same ones every time); null: all of it.",
        default=None,
    ),
    R(
        "trainer.ema_decay",
        number(0, 1, low_open=True, high_open=True),
        0.999,
        null="no weight average",
        fix="set e.g. trainer.ema_decay=0.999 (between 0 and 1, both excluded), or null (no weight average).",
        doc="A moving average of the weights with this decay, evaluated as eval_loss_ema; null: off.",
        default=None,
    ),
    R("trainer.log_every", whole(1), 10, required=True, doc="Steps between train lines in metrics.jsonl."),
    R(
        "trainer.throughput_warmup_steps",
        whole(0),
        5,
        required=True,
        doc="Steps left out of the samples/s measurement.",
    ),
    R("trainer.progress", flag, "true", required=True, doc="A progress bar on rank 0."),
    R(
        "trainer.dist_timeout_s",
        whole(1, 7 * 24 * 3600),
        1800,
        required=True,
        doc="The process group's timeout: a hung collective fails after this long (must exceed hang_timeout_s).",
    ),
    R(
        "trainer.hang_timeout_s",
        auto_or(number(0, 7 * 24 * 3600, low_open=True)),
        600,
        null="no hang watchdog",
        fix=(
            f"set trainer.hang_timeout_s=auto ({HANG_AUTO}), a number of seconds (e.g. 600), or null (no hang "
            "watchdog)."
        ),
        doc="No rank advanced for this long: dump every rank's stacks, name the stuck ones, end the job (exit code 4);"
        f" auto: {HANG_AUTO}; null: off.",
        default=hang.AUTO,
    ),
    R(
        "trainer.requeue_on_hang",
        flag,
        "false",
        required=True,
        doc="Slurm: after a hang, requeue the job once, excluding the stuck ranks' nodes.",
    ),
    R(
        "trainer.stop_grace_s",
        number(0, 7 * 24 * 3600, low_open=True),
        60,
        required=True,
        doc=(
            "After a stop signal, a rank that does not advance for this long (at least 3 median steps) stops at once, "
            "after dumping its stacks."
        ),
    ),
    R(
        "trainer.checkpoint_every",
        whole(0),
        100,
        required=True,
        fix="set e.g. trainer.checkpoint_every=100 (0: only on a stop signal and at the end).",
        doc="Optimizer steps between checkpoints (0: only on a stop signal and at the end).",
    ),
    R(
        "trainer.keep_checkpoints",
        whole(1),
        2,
        required=True,
        doc="The newest checkpoints kept in <run dir>/checkpoints.",
    ),
    R(
        "trainer.async_checkpoint",
        flag,
        "true",
        required=True,
        doc="Write checkpoints in the background: the loop waits only while the state is copied to CPU memory.",
    ),
    R(
        "trainer.max_requeues",
        whole(0),
        3,
        required=True,
        fix="set e.g. trainer.max_requeues=3 (0: never requeue).",
        doc="Slurm: requeues allowed after a time limit or preemption (a crash is never requeued).",
    ),
    PROFILE_NODE,
    *PROFILE_RULES,
)
