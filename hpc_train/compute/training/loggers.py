"""Where rank 0's metrics go: ``metrics.jsonl`` always, plus the trackers ``logger=...`` picks.

The trainer writes one record per logged step (``"kind": "train"``) and per evaluation
(``"kind": "eval"``); the writer here keeps the JSONL file (reports and tests read it) and sends
the same numbers to each tracker: TensorBoard (``tracker_tensorboard``), Weights & Biases
(``tracker_wandb``), MLflow (``tracker_mlflow``); ``logger=[tensorboard,mlflow]`` runs several
(``hpc_train.contracts.logger_table`` reads the choice). Only rank 0 builds trackers, and a tracker
imports its package only then: the login node and the other ranks never import them.

With replica groups the trackers are group 0's (its rank 0 opens them as it starts), while metrics.jsonl is written by
whichever group leads. A group 0 its launcher restarted continues the trackers' runs (the ids kept in the run dir,
as a resumed attempt does) and, at its first row, first passes them every row of the attempt that metrics.jsonl holds
(``catch_up``): the rows the group that led while it was out wrote (its failure and restart among them). TensorBoard
opens a new event file whose purge step is the attempt's first row, so the rows the dead process logged are replaced,
not doubled; MLflow skips a (metric, step) its run has; W&B logs them again, as a resumed attempt does.

A tracker has ``write(record)`` (train, eval and replica records), ``flush()`` (before every checkpoint
and at the stop signal: the rows written so far survive a kill -9 of rank 0 from then on, so what
a checkpoint covers is in the tracker too) and ``close()`` (once, at the end of a finished run);
what the trackers share is in ``tracker_common``. Each tracker module is imported
here inside the function that builds it: its package (tensorboard, wandb, mlflow) is optional and
heavy, and only rank 0 of a run that asks for it should import it.
"""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional

from hpc_train.compute.runtime.runlog import MetricsWriter
from hpc_train.compute.training.tracker_common import KINDS, LoggerSettings, attempt_rows, in_run_dir
from hpc_train.contracts import logger_table


def logger_settings(node: Optional[Mapping[str, Any]]) -> Optional[LoggerSettings]:
    """The settings of a job spec's ``logger`` node; None for a spec without one (metrics.jsonl only)."""
    if node is None:
        return None
    choice = logger_table.chosen(node)
    if choice.problem is not None:
        raise ValueError(f"{choice.problem}: use logger=jsonl, logger=tensorboard, logger=wandb or logger=mlflow")
    keys = [f.name for f in fields(LoggerSettings) if f.name != "trackers"]
    return LoggerSettings(trackers=tuple(choice.trackers), **{key: node[key] for key in keys})


def metrics_writer(
    settings: Optional[LoggerSettings],
    run_dir: Path,
    enabled: bool,
    config: Mapping[str, Any],
    slurm_job: bool,
    restarted: bool = False,
) -> MetricsWriter:
    """The metrics writer the logger settings ask for (metrics.jsonl alone without a logger node). `config` is the
    job spec as plain data, which W&B and MLflow record with the run; `slurm_job` is its ``backend.slurm_job``;
    `restarted`: a replica group its launcher restarted inside the attempt (its trackers continue and catch up)."""
    if not enabled or settings is None or not settings.trackers:
        return MetricsWriter(run_dir, enabled)
    trackers = [make_tracker(name, settings, run_dir, config, slurm_job, restarted) for name in settings.trackers]
    return TrackingWriter(run_dir, enabled, trackers, catch_up=restarted)


def make_tracker(
    name: str, settings: LoggerSettings, run_dir: Path, config: Mapping[str, Any], slurm_job: bool, restarted: bool
) -> Any:
    # each tracker module imports its optional package (tensorboard, wandb, mlflow): only the chosen one loads
    if name == "tensorboard":
        from hpc_train.compute.training.tracker_tensorboard import TensorBoardTracker  # optional: tensorboard

        return TensorBoardTracker(in_run_dir(settings.log_dir, run_dir))
    if name == "wandb":
        from hpc_train.compute.training.tracker_wandb import WandbTracker  # optional: wandb

        return WandbTracker(settings, run_dir, config, slurm_job, continues=restarted)
    from hpc_train.compute.training.tracker_mlflow import MlflowTracker  # optional: mlflow

    return MlflowTracker(settings, run_dir, config, continues=restarted)


class TrackingWriter(MetricsWriter):
    """metrics.jsonl first (a tracker that fails leaves it complete), then every tracker, in order."""

    def __init__(self, run_dir: Path, enabled: bool, trackers: List[Any], catch_up: bool = False) -> None:
        """`catch_up`: before the first row, the trackers take the attempt's rows metrics.jsonl holds already."""
        super().__init__(run_dir, enabled)
        self.trackers = trackers
        self.catch_up = catch_up

    def write(self, record: Dict[str, Any]) -> None:
        if self.enabled and self.catch_up:
            self.catch_up = False
            for row in attempt_rows(self.path.parent):  # read before this record is appended
                self._track(row)
        super().write(record)
        if self.enabled:
            self._track(record)

    def _track(self, record: Dict[str, Any]) -> None:
        if record.get("kind") in KINDS:
            for tracker in self.trackers:
                tracker.write(record)

    def flush(self) -> None:
        for tracker in self.trackers:
            tracker.flush()

    def close(self) -> None:
        for tracker in self.trackers:
            tracker.close()
