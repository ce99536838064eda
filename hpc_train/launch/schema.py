"""The type and range of every config key hpc-train reads, as one table.

Why a table: the keys come from eight config groups, users' own config dirs and any override;
one declarative list (key -> what it accepts and how to fix it) is easier to read and to keep
complete than type checks spread over the launch code. ``validate.check_keys`` walks it before
any layout is computed, so a wrong type never reaches code that would trip over it.

Rules:

* A key is checked when the config has it (a user's own option may leave optional keys out);
  the ``required`` ones must be there. ``*`` in a key matches every child of that node.
* Values are read resolved: a value interpolated from another key is checked where it is
  defined first (the table lists sources before the keys that interpolate them), and an
  interpolation that cannot be resolved is refused naming its key.
* Booleans must be real booleans (``true``/``false``); whole numbers must not be booleans;
  numbers must be finite. Text Slurm reads (job name, partition, account, QoS, constraint)
  must be plain ASCII without spaces or control characters; the values of extra sbatch options
  plain ASCII on one line (the script quotes them, as submitit does).
* The arguments of the shipped ``_target_`` s (torchvision ResNets, ``toy_mlp``, the digits,
  synthetic and image-folder datasets) are checked here too; the arguments of a user's own
  ``_target_`` are checked when the job starts (``hpc_train/compute/user/building.py``).

Cross-key rules (the batch splits over the ranks, stages fit the GPUs, ...) stay in
``validate.py``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Callable, Iterator, List, Optional, Sequence, Tuple

from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import InterpolationToMissingValueError, OmegaConfBaseException

from hpc_train import hang
from hpc_train.launch.config_view import MISSING_TEXT, ConfigView, copy_plain
from hpc_train.launch.errors import ConfigError
from hpc_train.launch.objective import NUMERIC_SUMMARY_KEYS
from hpc_train.script_command import ARG_STYLES
from hpc_train.slurm_time import limit_minutes
from hpc_train.strategy_table import NAMES as STRATEGY_NAMES
from hpc_train.strategy_table import strategy_id

Problem = Optional[str]  # None: the value is fine; else what is wrong, as a sentence fragment
Checker = Callable[[Any], Problem]

INT64_MAX = 2**63 - 1  # what torch, numpy and C code downstream can hold
MINUTES_PER_YEAR = 365 * 24 * 60
PRECISIONS = ("32", "bf16", "16")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def _show(value: Any) -> str:
    """repr, cut short: the message stays one readable line whatever was passed."""
    text_ = repr(value)
    return text_ if len(text_) <= 80 else text_[:60] + f"... ({len(text_)} characters)"


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_list(value: Any) -> bool:
    return isinstance(value, (list, ListConfig))


def _is_number(value: Any) -> bool:
    return _is_int(value) or (isinstance(value, float) and math.isfinite(value))  # math.isfinite(10**400) would raise


# -- checkers: each returns None or the problem ------------------------------------------------
def typed(what: str, check: Checker) -> Checker:
    """`check`, carrying the text the configuration reference shows as the key's type."""
    check.what = what  # type: ignore[attr-defined]
    return check


def type_text(check: Checker) -> str:
    return getattr(check, "what", "see the description")


def whole(low: int = 1, high: int = INT64_MAX) -> Checker:
    def check(value: Any) -> Problem:
        if not _is_int(value):
            return f"must be a whole number, got {_show(value)}"
        if value < low:
            return f"must be at least {low}, got {_show(value)}"
        if value > high:
            return f"must be at most {high}, got {_show(value)}"
        return None

    return typed(f"whole number, {low} to {high}" if high < INT64_MAX else f"whole number >= {low}", check)


def number(low: float, high: float = math.inf, low_open: bool = False, high_open: bool = False) -> Checker:
    below = "greater than" if low_open else "at least"
    above = "less than" if high_open else "at most"

    def check(value: Any) -> Problem:
        if not _is_number(value):
            return f"must be a finite number, got {_show(value)}"
        if value < low or (low_open and value == low):
            return f"must be {below} {low}, got {_show(value)}"
        if value > high or (high_open and value == high):
            return f"must be {above} {high}, got {_show(value)}"
        return None

    lower = f"> {low:g}" if low_open else f">= {low:g}"
    upper = "" if high == math.inf else (f", < {high:g}" if high_open else f", <= {high:g}")
    return typed(f"number {lower}{upper}", check)


def auto_or(checker: Checker) -> Checker:
    """The word auto, or what `checker` accepts."""

    def check(value: Any) -> Problem:
        if value == "auto":
            return None
        problem = checker(value)
        return None if problem is None else f"{problem.replace(', got', ' or auto, got', 1)}"

    return typed(f"auto, or {type_text(checker)}", check)


def flag(value: Any) -> Problem:
    return None if isinstance(value, bool) else f"must be true or false, got {_show(value)}"


def one_of(*choices: str, normalize: Callable[[str], str] = lambda s: s, ints: bool = False) -> Checker:
    def check(value: Any) -> Problem:
        if isinstance(value, str) or (ints and _is_int(value)):
            if normalize(str(value)) in choices:
                return None
        return f"must be one of {', '.join(choices)}, got {_show(value)}"

    return typed("one of " + " | ".join(choices), check)


def text(
    pattern: str = "", what: str = "non-empty text", max_len: int = 4096, ints: bool = False, min_len: int = 1
) -> Checker:
    """A string (an int too where ``ints``: job_name=2024) matching ``pattern``; never control characters."""
    compiled = re.compile(pattern) if pattern else None

    def check(value: Any) -> Problem:
        if not (isinstance(value, str) or (ints and _is_int(value))):
            return f"must be {what}, got {_show(value)}"
        word = str(value)
        if not min_len <= len(word) <= max_len:
            return f"must be {what} of {min_len} to {max_len} characters, got {_show(value)}"
        if _CONTROL.search(word):
            return f"must be {what} without newlines or other control characters, got {_show(value)}"
        if compiled is not None and word and not compiled.fullmatch(word):
            return f"must be {what}, got {_show(value)}"
        return None

    return typed(what, check)


def slurm_time(value: Any) -> Problem:
    """Minutes or a Slurm time string, parsed by the same function that renders --time."""
    if isinstance(value, bool) or not (isinstance(value, (int, str))):
        return f"must be minutes or a Slurm time such as 01:30:00, got {_show(value)}"
    try:
        minutes = limit_minutes(value)
    except ValueError:
        return (
            "must be a positive number of minutes or a Slurm time (MM, MM:SS, HH:MM:SS, D-HH:MM:SS), got"
            f" {_show(value)}"
        )
    if minutes > MINUTES_PER_YEAR:
        return f"must be at most a year ({MINUTES_PER_YEAR} minutes), got {_show(value)}"
    return None


def target_node(value: Any) -> Problem:
    if not isinstance(value, Mapping):
        return f"must be a config node with a _target_, got {_show(value)}"
    target = value.get("_target_")
    if not isinstance(target, str) or not target.strip():
        return f"needs a _target_ naming a class or function, got _target_={_show(target)}"
    if not re.fullmatch(r"[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*", target):
        return f"_target_ must be a dotted Python name such as my_package.MyClass, got {_show(target)}"
    return None


def name_or_target(*choices: str) -> Checker:
    """One of the built-in names, or a ``_target_`` node naming the user's own class or function."""
    names = one_of(*choices)

    def check(value: Any) -> Problem:
        if isinstance(value, Mapping):
            return target_node(value)
        if names(value) is None:
            return None
        return f"must be one of {', '.join(choices)} or a _target_ node, got {_show(value)}"

    return typed(" | ".join(choices) + " | a _target_ node", check)


def _regex_with_one_group(value: Any) -> Problem:
    if not isinstance(value, str):
        return f"must be a regular expression, got {_show(value)}"
    try:
        groups = re.compile(value).groups
    except re.error as err:
        return f"is not a regular expression ({err}): {_show(value)}"
    return None if groups == 1 else f"must have exactly one group (...), got {groups} in {_show(value)}"


def list_of(item: Checker, what: str, allow_empty: bool = True) -> Checker:
    def check(value: Any) -> Problem:
        if not _is_list(value):
            return f"must be a list of {what}, got {_show(value)}"
        if not allow_empty and len(value) == 0:
            return f"must be a non-empty list of {what}, got []"
        for index, element in enumerate(value):
            problem = item(element)
            if problem:
                return f"entry {index}: {problem}"
        return None

    return typed(f"list of {what}", check)


def balance(value: Any) -> Problem:
    if isinstance(value, str) and value in ("params", "time"):
        return None
    if _is_list(value) and len(value) > 0 and all(_is_int(c) and 1 <= c <= INT64_MAX for c in value):
        return None
    return f"must be params, time or a list of positive layer counts such as [5,10], got {_show(value)}"


def split_point(value: Any) -> Problem:
    # Hydra reads `[2]` as a number: the module names of an nn.Sequential are digits.
    if _is_int(value) and value >= 0:
        return None
    return text(what="a module name")(value) if isinstance(value, str) else f"must be a module name, got {_show(value)}"


def replicate(value: Any) -> Problem:
    if value == "nodes" or (_is_int(value) and value >= 1):
        return None
    return f"must be nodes or a positive whole number of replicas, got {_show(value)}"


def qos_row(value: Any) -> Problem:
    if not isinstance(value, Mapping) or set(value.keys()) != {"max_minutes", "qos"}:
        return f"must be {{max_minutes: N, qos: name}}, got {_show(value)}"
    return whole(1, MINUTES_PER_YEAR)(value["max_minutes"]) or SLURM_WORD(value["qos"])


def sbatch_options(value: Any) -> Problem:
    """cluster.extra: {option: value} rendered as `#SBATCH --option=value`; one line each, ASCII."""
    if not isinstance(value, Mapping):
        return f"must be a mapping of sbatch options such as {{exclusive: true, mail-type: END}}, got {_show(value)}"
    for name in value.keys():
        if not (isinstance(name, str) and re.fullmatch(r"[A-Za-z][A-Za-z0-9_-]*", name)):
            return f"has {_show(name)}, which is not an sbatch option name (letters, digits, '-', '_')"
        option = value[name]
        if isinstance(option, bool) or _is_number(option):
            continue
        problem = (
            text(r"[ -~]+", "plain ASCII text")(option)
            if isinstance(option, str)
            else f"must be text, a number or true, got {_show(option)}"
        )
        if problem:
            return f"option {_show(name)} {problem}"
    return None


for _check, _what in (
    (flag, "true | false"),
    (slurm_time, "minutes or a Slurm time (HH:MM:SS)"),
    (target_node, "a _target_ node"),
    (_regex_with_one_group, "a regular expression with one group"),
    (balance, "params | time | [layer counts]"),
    (split_point, "a module name"),
    (replicate, "nodes | a whole number >= 1"),
    (qos_row, "{max_minutes: N, qos: name}"),
    (sbatch_options, "{option: value}"),
):
    typed(_what, _check)


DECLARED_ONLY = typed("see the description", lambda value: None)  # a key checked elsewhere (named where declared)


SLURM_WORD = text(r"[A-Za-z0-9_.@:+-]+", "a Slurm name (ASCII letters, digits, '_', '.', '@', ':', '+', '-')", 255)
SLURM_WORDS = text(
    r"[A-Za-z0-9_.@:+-]+(,[A-Za-z0-9_.@:+-]+)*", "a Slurm name or a comma-separated list of names (ASCII)", 1024
)
PATH_TEXT = text(what="a path")


NO_DEFAULT: Any = type("NoDefault", (), {"__repr__": lambda self: "NO_DEFAULT"})()  # a key that must be given


@dataclass(frozen=True)
class Rule:
    """One configuration key, declared once: what it accepts, what it means, what a config without it runs with.

    ``default`` is the value the job runs with when the config has no such key (a user's own
    option may leave keys out; ``complete`` fills them in before anything reads the config);
    the shipped options give their own values in their YAML, each checked against ``check`` by
    tests/test_config_keys.py. ``only``: for strategy keys, the strategies (``strategy_table``
    identities) the key means something to, so a ``single`` job is not given pipeline settings.
    ``mapping``: the value may be a mapping of keys the shipped node need not have (sbatch
    options, a ``_target_`` and its arguments), so one given whole is merged as given (``whole_mappings``).
    """

    key: str
    check: Checker
    example: str  # the value shown in the fix: "set {key}={example}"
    null: Optional[str] = None  # what null means, when null is allowed
    required: bool = False
    fix: Optional[str] = None  # the whole fix sentence, where an example alone says too little
    doc: str = ""  # one line for the configuration reference
    default: Any = NO_DEFAULT
    only: Tuple[str, ...] = ()
    mapping: bool = False

    def fix_for(self, key: str) -> str:
        if self.fix:
            return self.fix
        tail = f", or {key}=null ({self.null})" if self.null else ""
        return f"set e.g. {key}={self.example}{tail}."

    @property
    def has_default(self) -> bool:
        return self.default is not NO_DEFAULT


def R(
    key: str,
    check: Checker,
    example: Any,
    null: Optional[str] = None,
    required: bool = False,
    fix: Optional[str] = None,
    doc: str = "",
    default: Any = NO_DEFAULT,
    only: Tuple[str, ...] = (),
    mapping: bool = False,
) -> Rule:
    return Rule(key, check, str(example), null, required, fix, doc, default, only, mapping)


# Order matters: a key is listed before the keys that interpolate it.
RULES: Tuple[Rule, ...] = (
    # top level
    R(
        "seed",
        whole(0, 2**32 - 1),
        0,
        required=True,
        doc="Model init, data order and every random generator derive from this.",
    ),
    R(
        "job_name",
        text(r"[A-Za-z0-9_.+-]+", "ASCII letters, digits, '.', '_', '+' or '-'", 200, ints=True),
        "resnet-ddp",
        required=True,
        fix="use letters, digits, '.', '_', '+' or '-' (Slurm job names and log prefixes), e.g. job_name=resnet-ddp.",
        doc="Slurm job name and log prefix.",
    ),
    R(
        "dry_run",
        flag,
        "true",
        required=True,
        fix="use dry_run=true (print the layout, run nothing) or dry_run=false.",
        doc="Print the layout (and, on Slurm, the exact sbatch script); run and submit nothing.",
    ),
    R(
        "resume",
        text(what="auto, never or a path"),
        "auto",
        required=True,
        fix="use resume=auto (newest checkpoint in the run dir), resume=never or resume=/path/to/run_dir.",
        doc="auto: the newest checkpoint in the run dir | never | a path to a run dir or checkpoint.",
    ),
    R(
        "objective",
        typed(
            "a key of summary.json",
            lambda value: (
                None
                if isinstance(value, str) and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", value)
                else f"must be a numeric key of summary.json, got {_show(value)}"
            ),
        ),  # which keys a job reports: objective.check_objective (a script job reports its own)
        "eval_loss",
        fix=(
            f"use one of: {', '.join(NUMERIC_SUMMARY_KEYS)} (e.g. objective=eval_accuracy), or train_<name> /"
            " eval_<name> for a metric your trainer.step returns."
        ),
        doc="The summary.json value each job returns to a sweeper that optimises (Optuna minimizes it).",
    ),
    # resources
    R(
        "resources.nodes",
        whole(1, 100_000),
        1,
        required=True,
        fix="set resources.nodes=1 or more.",
        doc="Nodes of the job.",
    ),
    R(
        "resources.gpus_per_node",
        whole(1, 1024),
        1,
        null="the cluster profile's; locally all GPUs",
        required=True,
        fix="set resources.gpus_per_node=1 or more (at most 1024), or null for the cluster profile's value.",
        doc="GPUs per node the job uses; null: the cluster profile's value (locally: all GPUs, or 2 CPU workers without GPUs).",
    ),
    R(
        "resources.time",
        slurm_time,
        "01:00:00",
        null="the cluster profile's",
        required=True,
        fix=(
            "set resources.time=01:00:00 (HH:MM:SS) or a number of minutes such as resources.time=90, or null for the"
            " cluster profile's."
        ),
        doc="Wall-clock limit (minutes or HH:MM:SS); null: the cluster profile's default.",
    ),
    # launcher
    R(
        "launcher.name",
        one_of("local", "slurm", "sbatch"),
        "local",
        required=True,
        fix="pick the launcher with launcher=local, launcher=slurm or launcher=sbatch.",
        doc="Where the job runs: local (this machine), slurm (submitted with submitit) or sbatch (inside your own sbatch script).",
    ),
    R(
        "launcher.wait",
        flag,
        "true",
        fix="use launcher.wait=true (follow the job to its end) or launcher.wait=false.",
        doc="Slurm: follow the job until it ends and print its summary.",
    ),
    R(
        "launcher.signal",
        one_of("USR1", "USR2", normalize=lambda s: s.upper().removeprefix("SIG")),
        "USR2",
        fix="use launcher.signal=USR2 (the default) or launcher.signal=USR1.",
        doc="The requeue signal (USR1 | USR2): checkpoint after the current step, then requeue.",
        default="USR2",
    ),
    R(
        "launcher.signal_delay_s",
        whole(1, 65535),
        120,
        fix="set e.g. launcher.signal_delay_s=120: enough to finish a step and write a checkpoint.",
        doc="Seconds before the time limit Slurm sends the requeue signal (#SBATCH --signal=USR2@120).",
        default=120,
    ),
    R(
        "launcher.master_port",
        whole(1, 65535),
        29500,
        null="a free port",
        doc="The rendezvous port of a local run; null: a free port.",
        default=None,
    ),
    R(
        "launcher.array_parallelism",
        whole(1, INT64_MAX),
        64,
        null="the cluster profile's cluster.array_parallelism, else no throttle",
        doc="A sweep's arrays run at most this many jobs at once (--array=0-N%P); null: the cluster profile's, else no throttle.",
        default=None,
    ),
    R(
        "cluster.array_parallelism",
        whole(1, INT64_MAX),
        64,
        null="no throttle",
        doc="The site's default throttle for sweeps (launcher.array_parallelism overrides it); null: none.",
        default=None,
    ),
    # cluster profile (the per-GPU-type table of jean_zay-like profiles first: the keys below interpolate it)
    R(
        "cluster.gpu_type",
        DECLARED_ONLY,
        "v100",
        doc="Profiles with a types table: the GPU type whose row the keys below read (check_profile_type checks it).",
    ),
    R("cluster.types.*.partition", SLURM_WORDS, "gpu_p13", doc="Per GPU type: its partition."),
    R(
        "cluster.types.*.constraint",
        text(r"[A-Za-z0-9_.,:&|!*\[\]()@+-]+", "a Slurm constraint (ASCII, no spaces)", 1024),
        "v100-32g",
        doc="Per GPU type: its --constraint.",
    ),
    R("cluster.types.*.gpus_per_node", whole(1, 1024), 4, doc="Per GPU type: GPUs per node."),
    R("cluster.types.*.cpus_per_gpu", whole(1, 1024), 10, doc="Per GPU type: CPU cores per GPU."),
    R(
        "cluster.types.*.qos_prefix",
        SLURM_WORD,
        "qos_gpu",
        doc="Per GPU type: the prefix of its QoS names (qos_gpu-t3 ...).",
    ),
    R(
        "cluster.name",
        text(r"[A-Za-z0-9_.+-]+", "a profile name (ASCII letters, digits, '.', '_', '+', '-')", 200),
        "mysite",
        required=True,
        doc="The profile's name (shown in messages).",
    ),
    R(
        "cluster.gpus_per_node",
        whole(1, 1024),
        4,
        null="locally: count the GPUs",
        doc="GPUs per node of the cluster; null: count them (nvidia-smi), 2 CPU workers when there are none.",
        default=None,
    ),
    R(
        "cluster.cpus_per_gpu",
        whole(1, 1024),
        4,
        null="1",
        doc="--cpus-per-task = cpus_per_gpu x GPUs per task; null: 1.",
        default=None,
    ),
    R(
        "cluster.partition",
        SLURM_WORDS,
        "gpu",
        null="the cluster's default partition",
        doc="--partition; null: the cluster's default partition.",
        default=None,
    ),
    R(
        "cluster.account",
        SLURM_WORD,
        "myproject",
        null="no --account",
        doc="--account; null: none (or from account_env).",
        default=None,
    ),
    R(
        "cluster.account_env",
        text(r"[A-Za-z_][A-Za-z0-9_]*", "an environment variable name"),
        "IDRPROJ",
        null="no account from the environment",
        doc="The environment variable holding the account (e.g. IDRPROJ); null: none.",
        default=None,
    ),
    R(
        "cluster.account_suffix",
        text(r"[A-Za-z0-9_.@:+-]+", "ASCII text without spaces", 255, min_len=0),
        "@v100",
        fix="set e.g. cluster.account_suffix=@v100, or cluster.account_suffix='' for none.",
        doc="Appended to the account read from account_env (e.g. @v100).",
        default="",
    ),
    R(
        "cluster.qos",
        SLURM_WORD,
        "qos_gpu-t3",
        null="from qos_by_time, else none",
        doc="--qos; null: from qos_by_time, else none.",
        default=None,
    ),
    R(
        "cluster.qos_by_time",
        list_of(qos_row, "{max_minutes: N, qos: name} rows"),
        "[]",
        null="no QoS by time",
        fix=(
            "give rows such as cluster.qos_by_time='[{max_minutes:120,qos:short}]', or cluster.qos_by_time=[] for none."
        ),
        doc="Rows {max_minutes: N, qos: name}: the first row the time limit fits in gives --qos.",
        default=None,
    ),
    R(
        "cluster.constraint",
        text(r"[A-Za-z0-9_.,:&|!*\[\]()@+-]+", "a Slurm constraint (ASCII, no spaces)", 1024),
        "a100",
        null="no --constraint",
        doc="--constraint, e.g. a100; null: none.",
        default=None,
    ),
    R(
        "cluster.hint",
        one_of("nomultithread", "multithread", "compute_bound", "memory_bound"),
        "nomultithread",
        null="no --hint",
        doc="--hint, e.g. nomultithread; null: none.",
        default=None,
    ),
    R(
        "cluster.gpu_flag",
        one_of("gres", "gpus-per-node"),
        "gres",
        fix="use cluster.gpu_flag=gres or cluster.gpu_flag=gpus-per-node.",
        doc="How GPUs are asked for: gres (--gres=gpu:G) or gpus-per-node (--gpus-per-node=G).",
        default="gres",
    ),
    R(
        "cluster.time",
        slurm_time,
        "01:00:00",
        fix="set cluster.time=01:00:00 (HH:MM:SS) or a number of minutes.",
        doc="The profile's default wall-clock limit (resources.time overrides it).",
    ),
    R(
        "cluster.mem_gb",
        whole(1, 2**20),
        64,
        null="the cluster's default",
        doc="--mem per node in GB; null: the cluster's default.",
        default=None,
    ),
    R(
        "cluster.setup",
        list_of(text(what="a shell command line"), "shell command lines"),
        "'[module purge,module load pytorch-gpu]'",
        null="no setup lines",
        fix=(
            "give one plain command per list entry, e.g. cluster.setup='[module purge,module load pytorch-gpu]', or"
            " cluster.setup=[]."
        ),
        doc="Shell lines run before srun, e.g. [module purge, module load pytorch-gpu].",
        default=None,
    ),
    R(
        "cluster.extra",
        sbatch_options,
        "{exclusive:true}",
        null="no extra options",
        fix="give sbatch options as a mapping, e.g. +cluster.extra.mail-type=END or cluster.extra={} for none.",
        doc="Any other sbatch option as {option: value}, e.g. {exclusive: true, mail-type: END}.",
        default=None,
        mapping=True,
    ),
    # strategy
    R(
        "strategy.name",
        one_of(*STRATEGY_NAMES),
        "ddp",
        required=True,
        fix=f"pick the strategy with strategy={'|'.join(STRATEGY_NAMES)}.",
        doc="The parallelism strategy (pick it with strategy=NAME).",
    ),
    R(
        "strategy.stages",
        whole(1),
        2,
        null="one stage per GPU, or len(split_points) + 1",
        doc="Stages the model is cut into; null: one per GPU of the task (2 on CPUs), or len(split_points) + 1.",
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
        default="native",
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
    # trainer (conf/trainer/default.yaml: every key is read by the training loop)
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
        doc="sgd | adamw | a partial optimizer class, called as f(param_groups, lr=trainer.lr, weight_decay=trainer.weight_decay).",
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
        doc="single | no_decay_1d (no weight decay on biases, norm weights, 1-D parameters) | a partial function groups(model).",
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
        "hpc_train.compute.training.steps.model_loss",
        null="the built-in step: trainer.loss of the model's output against the target",
        fix=(
            "set trainer.step={_target_: my_package.step, _partial_: true} (a function step(model, batch) returning the"
            " loss), trainer.step._target_=hpc_train.compute.training.steps.model_loss for a model that computes its own loss, or"
            " trainer.step=null."
        ),
        doc="null: loss(model(input), target) on (input, target) pairs | a partial function step(model, batch) returning the loss (or a dict with loss and metrics).",
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
        fix="set trainer.hang_timeout_s=auto (max(300 s, 20 median steps)), a number of seconds (e.g. 600),"
        " or null (no hang watchdog).",
        doc="No rank advanced for this long: dump every rank's stacks, name the stuck ones, end the job (exit code 4); auto: max(300 s, 20 median steps); null: off.",
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
        doc="After a stop signal, a rank that does not advance for this long (at least 3 median steps) stops at once, after dumping its stacks.",
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
        "trainer.max_requeues",
        whole(0),
        3,
        required=True,
        fix="set e.g. trainer.max_requeues=3 (0: never requeue).",
        doc="Slurm: requeues allowed after a time limit or preemption (a crash is never requeued).",
    ),
    # script (your own training script: hpc-train ... -- train.py ARGS; validate.check_script checks the file)
    R(
        "script.argv",
        list_of(text(what="an argument", min_len=0), "arguments", allow_empty=False),
        "[train.py,--batch_size=32]",
        null="hpc_train's own trainer",
        fix="give the script's command after `--`: hpc-train ... -- train.py ARGS (or -- -m package.module ARGS).",
        doc="Your script's command (what follows `--`): [train.py, ARGS...] | [-m, package.module, ARGS...]; null: hpc_train's own trainer.",
        default=None,
    ),
    R(
        "script.cwd",
        PATH_TEXT,
        "/path/to/project",
        null="the directory hpc-train was started in",
        doc="Where the script runs; null: the directory hpc-train was started in.",
        default=None,
    ),
    R(
        "script.launcher",
        one_of("direct", "torchrun"),
        "torchrun",
        fix="use script.launcher=direct (every task runs the script) or script.launcher=torchrun (one per node).",
        doc="direct: every task runs the script | torchrun: one task per node runs torchrun, which starts the node's ranks.",
        default="direct",
    ),
    R(
        "script.overrides",
        typed(
            "{argument: value}",
            lambda value: None if isinstance(value, Mapping) else f"must be a mapping of arguments, got {_show(value)}",
        ),
        "{}",
        fix="add arguments as +script.overrides.KEY=VALUE (one per key), e.g. +script.overrides.learning_rate=1e-3.",
        doc="+script.overrides.KEY=VALUE: one argument per key appended to the command (sweep them with -m).",
        default={},
        mapping=True,
    ),
    R(
        "script.arg_style",
        one_of(*ARG_STYLES),
        "'--{key}={value}'",
        fix="use script.arg_style='--{key}={value}', '--{key} {value}' (argparse) or '{key}={value}' (Hydra apps).",
        doc='How an override is written: "--{key}={value}" | "--{key} {value}" | "{key}={value}".',
        default=ARG_STYLES[0],
    ),
    R(
        "script.resume_args",
        list_of(text(what="an argument", min_len=0), "arguments"),
        "\"['--init_from=resume']\"",
        doc="Arguments appended on every attempt after the first (a requeue, a rerun), e.g. [--init_from=resume].",
        default=[],
    ),
    R(
        "script.resume_if",
        PATH_TEXT,
        "out/ckpt.pt",
        null="always add script.resume_args after the first attempt",
        doc="A path: add resume_args only if it exists (e.g. the script's ckpt.pt); null: always.",
        default=None,
    ),
    R(
        "script.signal",
        one_of("SIGUSR1", "SIGUSR2", "SIGTERM", "SIGINT", "USR1", "USR2", "TERM", "INT", normalize=str.upper),
        "SIGUSR1",
        null="no signal reaches the script; hpc_train requeues the job itself",
        fix="use script.signal=SIGUSR1 (Lightning's), SIGUSR2, SIGTERM or SIGINT, or script.signal=null.",
        doc="A signal forwarded to every rank before a requeue (e.g. SIGUSR1, Lightning's); null: hpc_train requeues the job itself.",
        default=None,
    ),
    R(
        "script.signal_grace_s",
        whole(0, 24 * 3600),
        60,
        doc="Seconds the script may take after script.signal before hpc_train requeues the job.",
        default=60,
    ),
    R(
        "script.objective_regex",
        _regex_with_one_group,
        "'val loss ([0-9.]+)'",
        null="no objective from the script's output",
        fix="give a regular expression with one group around the number, e.g. script.objective_regex='val loss ([0-9.]+)'.",
        doc="A regex with one group, e.g. 'val loss ([0-9.]+)': its last match in the script's output is the objective; null: none.",
        default=None,
    ),
    # logger (logger.name and logger.trackers are checked by validate.check_logger, which also looks for the packages)
    R(
        "logger.name",
        DECLARED_ONLY,
        "jsonl",
        doc="The logger option (jsonl, tensorboard, wandb, mlflow; set by logger=NAME).",
    ),
    R(
        "logger.trackers",
        DECLARED_ONLY,
        "{tensorboard:true}",
        doc="The trackers beside metrics.jsonl as {name: true} (logger=[tensorboard,mlflow] merges the options' maps).",
        mapping=True,
    ),
    R(
        "logger.log_dir",
        PATH_TEXT,
        "tensorboard",
        fix="set logger.log_dir=tensorboard (relative to the run dir) or an absolute path.",
        doc="TensorBoard: where the event files go (relative to the run dir, or absolute).",
    ),
    R(
        "logger.project",
        text(r"[^/\\#?%:]+", "a W&B project name (no '/', '\\', '#', '?', '%' or ':')", 128, ints=True),
        "my-project",
        null="W&B's default project",
        doc="W&B: the project.",
    ),
    R(
        "logger.entity",
        text(r"[^/\\#?%:]+", "a W&B user or team name", 128, ints=True),
        "my-team",
        null="your default entity",
        doc="W&B: your user or team; null: your default entity.",
    ),
    R(
        "logger.run_name",
        text(max_len=128, ints=True),
        "resnet-baseline",
        null="the run dir's last two parts",
        doc="W&B / MLflow: the run's display name; null: the run dir's last two parts.",
    ),
    R(
        "logger.tags",
        list_of(text(max_len=64, ints=True), "tags of 1 to 64 characters"),
        "[baseline,resnet]",
        null="no tags",
        fix="set e.g. logger.tags=[baseline,resnet] (W&B tags: at most 64 characters each).",
        doc="W&B: the run's tags.",
    ),
    R(
        "logger.mode",
        one_of("online", "offline", "disabled"),
        "offline",
        null="$WANDB_MODE, else offline on Slurm, else online",
        doc="W&B: online | offline | disabled; null: $WANDB_MODE if set, else offline on Slurm, else online.",
    ),
    R(
        "logger.dir",
        PATH_TEXT,
        "wandb_runs",
        null="the run dir",
        doc="W&B: where its wandb/ folder goes; null: the run dir.",
    ),
    R(
        "logger.tracking_uri",
        text(what="an MLflow tracking URI"),
        "http://mlflow-server:5000",
        null="an SQLite store in each run dir",
        doc="MLflow: the tracking URI; null: one SQLite store per job, sqlite:///<run dir>/mlflow.db.",
    ),
    R(
        "logger.experiment",
        text(max_len=500, ints=True),
        "my-experiment",
        null="MLflow's Default experiment",
        doc="MLflow: the experiment (created if missing); null: MLflow's Default.",
    ),
    R(
        "logger.log_model",
        flag,
        "true",
        doc="MLflow: log the final model.pt (or model_stage*.pt) as an artifact at the end.",
    ),
    # data: plain keys of the shipped options (and of a user's own node that uses these names), then the nodes
    R(
        "data.root",
        PATH_TEXT,
        "/path/to/dataset",
        fix="pass data.root=/path/to/dataset, a folder holding train/ and val/ with one sub-folder per class.",
        doc="imagefolder: the folder holding train/ and val/, one sub-folder per class.",
    ),
    R("data.train_dir", PATH_TEXT, "train", doc="imagefolder: the training split's folder under root."),
    R("data.val_dir", PATH_TEXT, "val", doc="imagefolder: the validation split's folder under root."),
    R("data.image_size", whole(1, 65536), 32, doc="The side of the (square) images the datasets produce."),
    R(
        "data.num_classes",
        whole(1),
        10,
        fix="pass data.num_classes=N, the number of classes (at least 1).",
        doc="The number of classes (the model nodes read it).",
    ),
    R("data.num_samples", whole(1), 1024, doc="synthetic: training samples (generated once, held in memory)."),
    R("data.val_samples", whole(1), 256, doc="synthetic: validation samples."),
    R(
        "data.val_fraction",
        number(0, 1, low_open=True, high_open=True),
        0.2,
        doc="digits: the fraction held out for validation.",
    ),
    R(
        "data.num_workers",
        whole(0, 1024),
        4,
        doc="DataLoader worker processes per rank (not passed to the datasets).",
        default=0,
    ),
    R("data.pin_memory", flag, "true", doc="DataLoader pin_memory (on GPUs only).", default=False),
    R(
        "data.train",
        target_node,
        "my_package.MyDataset",
        required=True,
        fix=(
            "set data.train._target_=my_package.MyDataset (its other keys are the constructor's arguments); see"
            " conf/data/synthetic.yaml."
        ),
        doc="The training dataset: a node whose _target_ builds it (its other keys are the arguments).",
        mapping=True,
    ),
    R(
        "data.val",
        target_node,
        "my_package.MyDataset",
        null="no evaluation",
        doc="The validation dataset, like data.train; null: no evaluation.",
        default=None,
        mapping=True,
    ),
    R(
        "data.collate_fn",
        target_node,
        "my_package.collate",
        null="PyTorch's default collate",
        fix=(
            "set data.collate_fn._target_=my_package.collate with data.collate_fn._partial_=true, or"
            " data.collate_fn=null."
        ),
        doc="A partial collate function for the DataLoader; null: PyTorch's default.",
        default=None,
        mapping=True,
    ),
    R(
        "model",
        target_node,
        "torchvision.models.resnet18",
        required=True,
        fix="pick a model (model=resnet18) or give a node whose _target_ names an nn.Module class or factory.",
        doc="The model: a node whose _target_ names an nn.Module class or factory (its other keys are the arguments).",
        mapping=True,
    ),
)

_CLASSES = (whole(1), 10, "The number of classes (the model's output size).")
_IMAGE = {"image_size": (whole(1, 65536), 32, "The side of the square images.")}
_RESNETS = {f"torchvision.models.resnet{n}": {"num_classes": _CLASSES} for n in (18, 34, 50, 101, 152)}
# Arguments of the shipped _target_s, checked where a node names one (a user's own: at job start):
# argument -> (check, example, one-line doc).
TARGET_ARGS = {
    **_RESNETS,
    "hpc_train.compute.models.toy_mlp": {
        **_IMAGE,
        "num_classes": _CLASSES,
        "hidden": (whole(1), 64, "The hidden layer's width."),
        "in_channels": (whole(1), 3, "Channels of the input images."),
    },
    "hpc_train.compute.datasets.digits": {
        "split": (one_of("train", "val"), "train", "Which split this node reads."),
        **_IMAGE,
        "val_fraction": (number(0, 1, True, True), 0.2, "The fraction held out for validation (a fixed split)."),
    },
    "hpc_train.compute.datasets.synthetic": {
        "num_samples": (whole(1), 1024, "Samples generated (once, held in memory)."),
        **_IMAGE,
        "num_classes": _CLASSES,
        "seed": (whole(0, 2**32 - 1), 1, "The seed of the generated images and labels."),
    },
    "hpc_train.compute.datasets.image_folder": {
        "root": (PATH_TEXT, "/path/to/dataset", "The folder holding the splits."),
        "split": (PATH_TEXT, "train", "The split's folder under root (one sub-folder per class)."),
        **_IMAGE,
        "augment": (flag, "true", "Random resized crops and flips."),
    },
}
TARGET_NODES = ("model", "data.train", "data.val")


# -- reading the config ------------------------------------------------------------------------
# The checks read a plain, resolved copy of the config (one OmegaConf pass, a few ms); only when
# something does not resolve do they read the DictConfig itself, key by key, to name it.
_MISSING = object()  # `???`


def _first_line(err: BaseException) -> str:
    text_ = str(err).strip()
    return text_.splitlines()[0].rstrip(".") if text_ else type(err).__name__


def _unresolvable(key: str, err: BaseException) -> ConfigError:
    if isinstance(err, InterpolationToMissingValueError):
        return ConfigError(
            key,
            f"refers to a key that has no value (`???`): {_first_line(err)}.",
            "give that key a value (hpc-train --cfg job prints the config).",
        )
    return ConfigError(
        key,
        f"cannot be resolved: {_first_line(err)}.",
        "check the keys it refers to (hpc-train --cfg job prints the config).",
    )


def _is_map(node: Any) -> bool:
    return type(node) is dict or isinstance(node, Mapping)  # plain dicts first: ABC checks are slow in a big sweep


def _child(node: Any, name: Any, key: str) -> Any:
    """node[name], resolved; _MISSING for `???`; an interpolation that cannot be resolved is refused naming `key`."""
    if type(node) is dict:
        value = node[name]
        return _MISSING if value == MISSING_TEXT and isinstance(value, str) else value
    if isinstance(node, (DictConfig, ListConfig)):
        if OmegaConf.is_missing(node, name):
            return _MISSING
        try:
            return node[name]
        except OmegaConfBaseException as err:
            raise _unresolvable(key, err) from None
    value = node[name]
    return _MISSING if isinstance(value, str) and value == MISSING_TEXT else value


def _has(node: Any, name: str) -> bool:
    if type(node) is dict:
        return name in node
    return isinstance(node, Mapping) and name in node.keys()


def lookup(cfg: Any, pattern: str) -> Iterator[Tuple[str, Any]]:
    """(key, resolved value or _MISSING) for every key the dotted pattern names that the config has."""

    def walk(node: Any, parts: Sequence[str], prefix: str) -> Iterator[Tuple[str, Any]]:
        head, rest = parts[0], parts[1:]
        names = [str(k) for k in node.keys()] if head == "*" and _is_map(node) else [head]
        for name in names:
            if not _has(node, name):
                continue
            key = f"{prefix}.{name}" if prefix else name
            value = _child(node, name, key)
            if not rest:
                yield key, value
            elif _is_map(value):
                yield from walk(value, rest, key)

    return walk(cfg, pattern.split("."), "")


def _apply(key: str, value: Any, rule: Rule) -> None:
    if value is _MISSING:
        raise ConfigError(
            key,
            "has no value (it is `???` in the config) and this run needs one.",
            rule.fix_for(key).replace("set e.g.", "pass", 1),
        )
    if value is None and rule.null is not None:
        return
    try:
        problem = rule.check(value)
    except OmegaConfBaseException as err:  # an interpolation inside a list or mapping value
        raise _unresolvable(key, err) from None
    if problem:
        raise ConfigError(key, f"{problem}.", rule.fix_for(key))


def check_profile_type(cfg: Any) -> None:
    """Profiles with a per-GPU-type table (jean_zay): gpu_type must be one of its types, before anything reads them."""
    cluster = _child(cfg, "cluster", "cluster") if _has(cfg, "cluster") else None
    if not (_has(cluster, "gpu_type") and _has(cluster, "types")):
        return
    types = _child(cluster, "types", "cluster.types")
    gpu_type = _child(cluster, "gpu_type", "cluster.gpu_type")
    if not isinstance(types, Mapping) or not len(types):
        raise ConfigError(
            "cluster.types",
            f"must map each GPU type to its partition, constraint, gpus_per_node and cpus_per_gpu, got {_show(types)}.",
            "keep the profile's types table (see conf/cluster/jean_zay.yaml).",
        )
    known = [str(k) for k in types.keys()]
    for name in known:
        entry = _child(types, name, f"cluster.types.{name}")
        if not isinstance(entry, Mapping):
            raise ConfigError(
                f"cluster.types.{name}",
                "must be a mapping such as {partition: gpu_p13, constraint: v100-32g, gpus_per_node: 4, cpus_per_gpu:"
                f" 10}}, got {_show(entry)}.",
                "keep the profile's types table (see conf/cluster/jean_zay.yaml).",
            )
    if not isinstance(gpu_type, str) or gpu_type not in known:
        name = (
            cluster.get("name", "cluster")
            if not isinstance(cluster, DictConfig)
            else OmegaConf.select(cluster, "name", default="cluster", throw_on_resolution_failure=False)
        )
        raise ConfigError(
            "cluster.gpu_type",
            f"{_show(gpu_type)} is not a GPU type of the {name} profile, which knows {', '.join(known)}.",
            f"use one of: {', '.join(f'cluster.gpu_type={t}' for t in known)}.",
        )


def check_table(cfg: Any) -> None:
    """Every key of RULES that the config has (and every required one) has the type and range it must."""
    for rule in RULES:
        found = False
        for key, value in lookup(cfg, rule.key):
            found = True
            _apply(key, value, rule)
        if rule.required and not found:
            raise ConfigError(
                rule.key,
                f"is required but the config has no `{rule.key}` (was it deleted with ~{rule.key}, or left out of your"
                " own config file?).",
                f"give it a value: drop the ~{rule.key} override, or pass +{rule.key}={rule.example}.",
            )


def check_target_args(cfg: Any) -> None:
    """The arguments of the shipped _target_s the model and data nodes name."""
    for node_key in TARGET_NODES:
        for _, node in lookup(cfg, node_key):
            target = node.get("_target_") if isinstance(node, Mapping) else None
            for arg, (check, example, _) in TARGET_ARGS.get(str(target), {}).items():
                rule = Rule(f"{node_key}.{arg}", check, str(example))
                for key, value in lookup(cfg, rule.key):
                    _apply(key, value, rule)


def check_resolvable(node: Any, prefix: str = "") -> None:
    """Every value of a DictConfig resolves (the job spec is the config resolved): the first that does not is named."""
    if isinstance(node, DictConfig):
        for name in node.keys():
            if not (prefix == "" and name == "hydra"):
                key = f"{prefix}.{name}" if prefix else str(name)
                check_resolvable(_child(node, name, key), key)
    elif isinstance(node, ListConfig):
        for index in range(len(node)):
            check_resolvable(_child(node, index, f"{prefix}[{index}]"), f"{prefix}[{index}]")


def resolved(cfg: DictConfig) -> Optional[dict]:
    """The config as plain, resolved Python values (Hydra's own node left out); None when something does not resolve."""
    try:
        return {
            str(k): OmegaConf.to_container(v, resolve=True) if isinstance(v, (DictConfig, ListConfig)) else v
            for k in cfg.keys()
            if k != "hydra"
            for v in [_child(cfg, k, str(k))]
        }
    except (OmegaConfBaseException, ConfigError):
        return None


def check_plain(plain: dict) -> None:
    """Type and range of every key of a resolved config (plain data), in the table's order."""
    check_profile_type(plain)
    check_table(plain)
    check_target_args(plain)


def _overlaps(pattern: str, changed: Sequence[Tuple[str, ...]]) -> bool:
    """A rule's dotted pattern (`*` any child) and a changed key overlap: one is the other or inside it."""
    parts = pattern.split(".")
    return any(all(p == "*" or p == q for p, q in zip(parts, path)) for path in changed)


def check_changed(plain: dict, changed: Sequence[Sequence[Any]]) -> None:
    """check_plain for a config equal to an already checked one except at the `changed` key paths.

    A sweep's jobs differ from their shared composition in a few values: only the rules (and
    shipped _target_ arguments) that can see those keys are checked again, in the table's order.
    """
    paths = [tuple(str(part) for part in path) for path in changed]
    if not paths:
        return
    if any(path[0] == "cluster" for path in paths):
        check_profile_type(plain)
    for rule in RULES:
        if _overlaps(rule.key, paths):
            for key, value in lookup(plain, rule.key):
                _apply(key, value, rule)
    if any(_overlaps(node_key, paths) for node_key in TARGET_NODES):
        check_target_args(plain)


def checked_view(cfg: DictConfig) -> ConfigView:
    """The config resolved once and checked key by key (raises ConfigError): what the rest of the login side reads.

    The table is checked in its order (so the key a bad value comes from is named first); a
    value that does not resolve is named by ``check_resolvable``.
    """
    plain = resolved(cfg)
    if plain is None:
        check_profile_type(cfg)
        check_table(cfg)
        check_target_args(cfg)
        check_resolvable(cfg)
        raise ConfigError("config", "a value does not resolve.", "run with HYDRA_FULL_ERROR=1 to see which.")
    check_plain(plain)
    complete(plain)
    return ConfigView(plain)


def check_keys(cfg: DictConfig) -> None:
    """Type and range of every key, before the layout is computed or anything runs; raises ConfigError."""
    checked_view(cfg)


# -- the declared defaults -----------------------------------------------------------------------
def _declared_defaults() -> dict:
    return {rule.key: rule.default for rule in RULES if rule.has_default and "*" not in rule.key}


DEFAULTS = _declared_defaults()  # "trainer.grad_accum_steps" -> 1: what a config without the key runs with


# -- mappings given whole on the command line ----------------------------------------------------
MAPPING_KEYS = frozenset(rule.key for rule in RULES if rule.mapping)


def whole_mappings(overrides: Sequence[str]) -> List[str]:
    """The overrides, with each that gives a mapping key a whole mapping (``cluster.extra={exclusive:true}``) as ``++``.

    Hydra merges ``key={...}`` into the node the config ships under the config's struct flag, which
    refuses every key that node lacks: a profile shipping ``extra: {}`` refused any sbatch option
    given whole, and a shipped ``trainer.loss`` any argument it does not set. ``++`` is Hydra's
    same merge with the flag lifted: the given keys are added, the shipped keys they do not name
    are kept, and the table checks the merged mapping. Only keys the table declares as mappings,
    written without a prefix of their own; every other override is left to Hydra as typed.
    """
    return [f"++{override}" if _gives_whole_mapping(override) else override for override in overrides]


def _gives_whole_mapping(override: str) -> bool:
    key, sep, value = override.partition("=")
    return bool(sep) and key in MAPPING_KEYS and value.lstrip().startswith("{")


def complete(plain: dict) -> list:
    """Fill every declared key a (resolved, checked) config leaves out with its default; the keys filled.

    Only inside sections the config has, and strategy keys only for the strategies they apply to
    (``Rule.only``). After this every reader (the layout, the job spec, the ranks) reads the
    value itself, with no fallback of its own: the default is written once, in RULES.
    """
    filled = []
    strategy = plain.get("strategy")
    chosen = strategy_id(strategy) if isinstance(strategy, Mapping) else None
    for rule in RULES:
        if not rule.has_default or "*" in rule.key:
            continue
        *parents, name = rule.key.split(".")
        node: Any = plain
        for part in parents:
            node = node.get(part) if isinstance(node, Mapping) else None
        if not isinstance(node, dict) or name in node:
            continue
        if rule.only and (parents[:1] != ["strategy"] or chosen not in rule.only):
            continue
        node[name] = copy_plain(rule.default)
        filled.append(rule.key)
    return filled
