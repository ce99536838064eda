"""logger=tensorboard: rank 0's records as TensorBoard scalars tagged ``<kind>/<key>`` (train/loss, eval/accuracy)."""

from __future__ import annotations

import atexit
from pathlib import Path
from typing import Any, Dict, Optional

from torch.utils.tensorboard import SummaryWriter

from hpc_train.compute.training.tracker_common import scalars


class TensorBoardTracker:
    """A ``SummaryWriter``; events are flushed at every record, so a killed job keeps them."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self._writer: Optional[Any] = None

    def write(self, record: Dict[str, Any]) -> None:
        step = int(record["step"])
        if self._writer is None:
            # purge_step: a resumed run hides the events a lost attempt logged past its checkpoint,
            # as metrics.jsonl drops those lines.
            self._writer = SummaryWriter(log_dir=str(self.log_dir), purge_step=step)
            atexit.register(self.close)
        for key, value in scalars(record):
            self._writer.add_scalar(f"{record['kind']}/{key}", value, step, walltime=record.get("time"))
        self._writer.flush()

    def flush(self) -> None:
        """Every record is flushed already; a writer's flush costs nothing when nothing is pending."""
        if self._writer is not None:
            self._writer.flush()

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None
