"""Where rank 0's metrics go: ``metrics.jsonl`` always, plus the trackers ``logger=...`` picks.

The trainer writes one record per logged step (``"kind": "train"``) and per evaluation
(``"kind": "eval"``); the writer here keeps the JSONL file (reports and tests read it) and sends
the same numbers to each tracker: TensorBoard (``tracker_tensorboard``), Weights & Biases
(``tracker_wandb``), MLflow (``tracker_mlflow``); ``logger=[tensorboard,mlflow]`` runs several
(``hpc_train.logger_table`` reads the choice). Only rank 0 builds trackers, and a tracker
imports its package only then: the login node and the other ranks never import them.

A tracker has ``write(record)`` (train and eval records only) and ``close()`` (once, at the end of
a finished run). The helpers below are what they share: the numbers of a record, whether this
attempt resumed a run (then a tracker continues the run whose id it kept in the run dir).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Tuple

from omegaconf import OmegaConf

from hpc_train import logger_table, rundir
from hpc_train.compute.runtime.runlog import MetricsWriter

# The record kinds sent to trackers: every number of the record (the loss, lr, accuracy and the metrics of a
# user's trainer.step) as a scalar named after its kind and key, except these bookkeeping keys.
KINDS = ("train", "eval")
NOT_SCALARS = ("kind", "step", "epoch", "time", "samples")


def metrics_writer(cfg, run_dir: Path, enabled: bool) -> MetricsWriter:
    """The metrics writer `cfg.logger` asks for (metrics.jsonl only when the config has no logger node)."""
    choice = logger_table.chosen(OmegaConf.select(cfg, "logger", default=None))
    if choice.problem is not None:
        raise ValueError(f"{choice.problem}: use logger=jsonl, logger=tensorboard, logger=wandb or logger=mlflow")
    if not enabled or not choice.trackers:
        return MetricsWriter(run_dir, enabled)
    return TrackingWriter(run_dir, enabled, [make_tracker(name, cfg, run_dir) for name in choice.trackers])


def make_tracker(name: str, cfg, run_dir: Path) -> Any:
    if name == "tensorboard":
        from hpc_train.compute.training.tracker_tensorboard import TensorBoardTracker

        return TensorBoardTracker(in_run_dir(cfg.logger.get("log_dir") or "tensorboard", run_dir))
    if name == "wandb":
        from hpc_train.compute.training.tracker_wandb import WandbTracker

        return WandbTracker(cfg, run_dir)
    from hpc_train.compute.training.tracker_mlflow import MlflowTracker

    return MlflowTracker(cfg, run_dir)


class TrackingWriter(MetricsWriter):
    """metrics.jsonl first (a tracker that fails leaves it complete), then every tracker, in order."""

    def __init__(self, run_dir: Path, enabled: bool, trackers: List[Any]) -> None:
        super().__init__(run_dir, enabled)
        self.trackers = trackers

    def write(self, record: Dict[str, Any]) -> None:
        super().write(record)
        if self.enabled and record.get("kind") in KINDS:
            for tracker in self.trackers:
                tracker.write(record)

    def close(self) -> None:
        for tracker in self.trackers:
            tracker.close()


# -- what the trackers share -------------------------------------------------------------------
def scalars(record: Dict[str, Any]) -> Iterator[Tuple[str, float]]:
    """(key, value) for every number of a record but the bookkeeping keys (booleans are no numbers here)."""
    for key, value in record.items():
        if key not in NOT_SCALARS and isinstance(value, (int, float)) and not isinstance(value, bool):
            yield key, float(value)


def in_run_dir(path: Any, run_dir: Path) -> Path:
    """A logger path: relative to the run dir, or absolute; `~` expanded."""
    folder = Path(str(path)).expanduser()
    return folder if folder.is_absolute() else run_dir / folder


def run_label(run_dir: Path) -> str:
    """A tracker run's default name: the run dir's last two parts (2026-11-22/20-31-14, or 21-05-00/3 in a sweep)."""
    run_dir = Path(run_dir).absolute()
    return f"{run_dir.parent.name}/{run_dir.name}"


def resumed_attempt(run_dir: Path) -> bool:
    """Whether this attempt continues a run from a checkpoint (read from attempts.jsonl, which the trainer writes
    before the first record): a tracker then continues its run instead of starting a new one."""
    starts = [r for r in rundir.read_attempts(run_dir) if r.get("event") == "start"]
    return bool(starts) and starts[-1].get("resumed_from_step") is not None


def read_run_file(path: Path) -> Optional[Dict[str, Any]]:
    """A tracker's run file (`wandb_run.json`, `mlflow_run.json`), None when missing or unreadable."""
    data = rundir.read_json(Path(path))
    return data if isinstance(data, dict) else None


def write_run_file(path: Path, data: Dict[str, Any]) -> None:
    rundir.write_json_atomic(path, data)
