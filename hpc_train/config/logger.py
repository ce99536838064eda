"""The logger group: the trackers beside metrics.jsonl and their settings.

logger.name and logger.trackers are checked by validate.check_logger, which also looks for the packages."""

from __future__ import annotations

from typing import Tuple

from hpc_train.config.checks import DECLARED_ONLY, PATH_TEXT, flag, list_of, one_of, text
from hpc_train.config.rule import R, Rule

RULES: Tuple[Rule, ...] = (
    R(
        "logger.name",
        DECLARED_ONLY,
        "jsonl",
        doc="The logger option (jsonl, tensorboard, wandb, mlflow; set by logger=NAME).",
        default="jsonl",
    ),
    R(
        "logger.trackers",
        DECLARED_ONLY,
        "{tensorboard:true}",
        doc="The trackers beside metrics.jsonl as {name: true} (logger=[tensorboard,mlflow] merges the options' maps).",
        mapping=True,
        left_out="logger.name alone picks the tracker (a logger option written before trackers existed)",
    ),
    R(
        "logger.log_dir",
        PATH_TEXT,
        "tensorboard",
        fix="set logger.log_dir=tensorboard (relative to the run dir) or an absolute path.",
        doc="TensorBoard: where the event files go (relative to the run dir, or absolute).",
        default="tensorboard",
    ),
    R(
        "logger.project",
        text(r"[^/\\#?%:]+", "a W&B project name (no '/', '\\', '#', '?', '%' or ':')", 128, ints=True),
        "my-project",
        null="W&B's default project",
        doc="W&B: the project.",
        default=None,
    ),
    R(
        "logger.entity",
        text(r"[^/\\#?%:]+", "a W&B user or team name", 128, ints=True),
        "my-team",
        null="your default entity",
        doc="W&B: your user or team; null: your default entity.",
        default=None,
    ),
    R(
        "logger.run_name",
        text(max_len=128, ints=True),
        "resnet-baseline",
        null="the run dir's last two parts",
        doc="W&B / MLflow: the run's display name; null: the run dir's last two parts.",
        default=None,
    ),
    R(
        "logger.tags",
        list_of(text(max_len=64, ints=True), "tags of 1 to 64 characters"),
        "[baseline,resnet]",
        null="no tags",
        fix="set e.g. logger.tags=[baseline,resnet] (W&B tags: at most 64 characters each).",
        doc="W&B: the run's tags.",
        default=[],
    ),
    R(
        "logger.mode",
        one_of("online", "offline", "disabled"),
        "offline",
        null="$WANDB_MODE, else offline on Slurm, else online",
        doc="W&B: online | offline | disabled; null: $WANDB_MODE if set, else offline on Slurm, else online.",
        default=None,
    ),
    R(
        "logger.dir",
        PATH_TEXT,
        "wandb_runs",
        null="the run dir",
        doc="W&B: where its wandb/ folder goes; null: the run dir.",
        default=None,
    ),
    R(
        "logger.tracking_uri",
        text(what="an MLflow tracking URI"),
        "http://mlflow-server:5000",
        null="an SQLite store in each run dir",
        doc="MLflow: the tracking URI; null: one SQLite store per job, sqlite:///<run dir>/mlflow.db.",
        default=None,
    ),
    R(
        "logger.experiment",
        text(max_len=500, ints=True),
        "my-experiment",
        null="MLflow's Default experiment",
        doc="MLflow: the experiment (created if missing); null: MLflow's Default.",
        default=None,
    ),
    R(
        "logger.log_model",
        flag,
        "true",
        doc="MLflow: log the final model.pt (or model_stage*.pt) as an artifact at the end.",
        default=False,
    ),
)
