"""The script group: a user's own training script (hpc-train ... -- train.py ARGS).

validate.check_script checks the file itself."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Tuple

from hpc_train.config.checks import (
    PATH_TEXT,
    list_of,
    one_of,
    regex_with_one_group,
    show,
    text,
    typed,
    whole,
)
from hpc_train.config.rule import R, Rule
from hpc_train.processes.script_command import ARG_STYLES

RULES: Tuple[Rule, ...] = (
    R(
        "script.argv",
        list_of(text(what="an argument", min_len=0), "arguments", allow_empty=False),
        "[train.py,--batch_size=32]",
        null="hpc_train's own trainer",
        fix="give the script's command after `--`: hpc-train ... -- train.py ARGS (or -- -m package.module ARGS).",
        doc=(
            "Your script's command (what follows `--`): [train.py, ARGS...] | [-m, package.module, ARGS...]; null: "
            "hpc_train's own trainer."
        ),
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
        doc=(
            "direct: every task runs the script | torchrun: one task per node runs torchrun, which starts the node's "
            "ranks."
        ),
        default="direct",
    ),
    R(
        "script.overrides",
        typed(
            "{argument: value}",
            lambda value: None if isinstance(value, Mapping) else f"must be a mapping of arguments, got {show(value)}",
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
        doc=(
            "A signal forwarded to every rank before a requeue (e.g. SIGUSR1, Lightning's); null: hpc_train requeues "
            "the job itself."
        ),
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
        regex_with_one_group,
        "'val loss ([0-9.]+)'",
        null="no objective from the script's output",
        fix=(
            "give a regular expression with one group around the number, e.g. \"script.objective_regex='val loss "
            "([0-9.]+)'\" (double quotes for the shell, single ones for Hydra)."
        ),
        doc=(
            "A regex with one group, e.g. 'val loss ([0-9.]+)': its last match in the script's output is the "
            "objective; null: none."
        ),
        default=None,
    ),
)
