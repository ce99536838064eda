"""What the metric trackers (TensorBoard, W&B, MLflow) share: their settings (the logger section), the numbers of a
record, where their files go, a run's label, whether this attempt resumed a run (then a tracker continues the run
whose id it kept in the run dir)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Tuple

from hpc_train.records import replicas, rundir

# The record kinds sent to trackers: every number of the record (the loss, lr, accuracy and the metrics of a
# user's trainer.step) as a scalar named after its kind and key, except these bookkeeping keys.
# A replica group's row (hpc_train.records.replicas) reaches them at its step as replica/<event> = the group
# (replica/failed, replica/restarted, replica/dropped, replica/rejoined), replica/groups (how many groups train on)
# and its other numbers (the restart's number, the seconds the others waited); its wall clock ("s") is bookkeeping.
KINDS = ("train", "eval", replicas.KIND)
NOT_SCALARS = ("kind", "step", "epoch", "time", "samples", "s")


@dataclass(frozen=True)
class LoggerSettings:
    """The ``logger`` section: the trackers it picks beside metrics.jsonl (logger.name and logger.trackers, read by
    hpc_train.contracts.logger_table as on the login side) and the trackers' own keys."""

    trackers: Tuple[str, ...]
    name: str
    log_dir: str
    project: Optional[str]
    entity: Optional[str]
    run_name: Optional[str]
    tags: Optional[List[str]]
    mode: Optional[str]
    dir: Optional[str]
    tracking_uri: Optional[str]
    experiment: Optional[str]
    log_model: bool


def scalars(record: Dict[str, Any]) -> Iterator[Tuple[str, float]]:
    """(key, value) for every number of a record but the bookkeeping keys (booleans are no numbers here)."""
    for key, value in record.items():
        if key == "group" and record.get("kind") == replicas.KIND:
            key = str(record.get("event"))  # which event, as its tag: two events of one step stay apart
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
    return _attempt_start(run_dir) is not None


def _attempt_start(run_dir: Path) -> Optional[int]:
    """The step this attempt resumed from (None: it started from scratch, or there is no attempt log)."""
    starts = [r for r in rundir.read_attempts(run_dir) if r.get("event") == "start"]
    resumed = starts[-1].get("resumed_from_step") if starts else None
    return None if resumed is None else int(resumed)


def attempt_rows(run_dir: Path) -> List[Dict[str, Any]]:
    """The rows of metrics.jsonl this attempt wrote so far (those at or past the step it started from), in order."""
    first = _attempt_start(run_dir) or 0
    rows = rundir.read_jsonl(Path(run_dir) / rundir.METRICS)
    return [row for row in rows if isinstance(row.get("step"), int) and row["step"] >= first]


def read_run_file(path: Path) -> Optional[Dict[str, Any]]:
    """A tracker's run file (`wandb_run.json`, `mlflow_run.json`), None when missing or unreadable."""
    data = rundir.read_json(Path(path))
    return data if isinstance(data, dict) else None


def write_run_file(path: Path, data: Dict[str, Any]) -> None:
    rundir.write_json_atomic(path, data)
