"""The top-level keys of conf/config.yaml: seed, job name, dry run, resume and the objective a sweeper reads."""

from __future__ import annotations

import re
from typing import Tuple

from hpc_train.config.checks import flag, show, text, typed, whole
from hpc_train.config.rule import R, Rule

# Numeric keys of the summary.json rank 0 writes at the end of training (hpc_train/compute/training/trainer.py).
NUMERIC_SUMMARY_KEYS = (
    "eval_loss",
    "eval_accuracy",
    "train_loss",
    "samples_per_sec",
    "images_per_sec",  # the old name of samples_per_sec
    "tokens_per_sec",
    "eval_loss_ema",
    "eval_accuracy_ema",
    "global_step",
    "epochs_completed",
    "timed_steps",
)

RULES: Tuple[Rule, ...] = (
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
                else f"must be a numeric key of summary.json, got {show(value)}"
            ),
        ),  # which keys a job reports: objective.check_objective (a script job reports its own)
        "eval_loss",
        fix=(
            f"use one of: {', '.join(NUMERIC_SUMMARY_KEYS)} (e.g. objective=eval_accuracy), or train_<name> /"
            " eval_<name> for a metric your trainer.step returns."
        ),
        doc="The summary.json value each job returns to a sweeper that optimises (Optuna minimizes it).",
        left_out="a job of hpc_train's own trainer is refused (launch/objective.py); a script job reports its own",
    ),
)
