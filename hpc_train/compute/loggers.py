"""Where rank 0's metrics go: ``metrics.jsonl`` always, plus TensorBoard event files with ``logger=tensorboard``.

The trainer writes one record per logged step (``"kind": "train"``) and per evaluation
(``"kind": "eval"``); every writer here keeps the JSONL file (reports and tests read it) and
may send the same numbers elsewhere.
"""

from __future__ import annotations

import atexit
from pathlib import Path
from typing import Any, Dict, Optional

from omegaconf import OmegaConf

from hpc_train.compute.runlog import MetricsWriter

# The record kinds shown in TensorBoard: every number of the record (the loss, lr, accuracy and the metrics of
# a user's trainer.step) as a scalar tagged "<kind>/<key>", except these bookkeeping keys.
KINDS = ("train", "eval")
NOT_SCALARS = ("kind", "step", "epoch", "time", "samples")


def metrics_writer(cfg, run_dir: Path, enabled: bool) -> MetricsWriter:
    """The metrics writer `cfg.logger` asks for (jsonl when the config has no logger group)."""
    name = str(OmegaConf.select(cfg, "logger.name", default="jsonl") or "jsonl")
    if name == "tensorboard":
        log_dir = Path(str(cfg.logger.get("log_dir") or "tensorboard")).expanduser()
        return TensorBoardWriter(run_dir, enabled, log_dir if log_dir.is_absolute() else run_dir / log_dir)
    if name != "jsonl":
        raise ValueError(f"unknown logger {name!r}: use logger=jsonl or logger=tensorboard")
    return MetricsWriter(run_dir, enabled)


class TensorBoardWriter(MetricsWriter):
    """metrics.jsonl plus a ``SummaryWriter``; events are flushed at every record, so a killed job keeps them."""

    def __init__(self, run_dir: Path, enabled: bool, log_dir: Path) -> None:
        super().__init__(run_dir, enabled)
        self.log_dir = log_dir
        self._writer: Optional[Any] = None

    def write(self, record: Dict[str, Any]) -> None:
        super().write(record)
        if not self.enabled or record.get("kind") not in KINDS:
            return
        step = int(record["step"])
        if self._writer is None:
            from torch.utils.tensorboard import SummaryWriter

            # purge_step: a resumed run hides the events a lost attempt logged past its checkpoint,
            # as metrics.jsonl drops those lines.
            self._writer = SummaryWriter(log_dir=str(self.log_dir), purge_step=step)
            atexit.register(self.close)
        for key, value in record.items():
            if key not in NOT_SCALARS and isinstance(value, (int, float)) and not isinstance(value, bool):
                self._writer.add_scalar(
                    f"{record['kind']}/{key}", float(record[key]), step, walltime=record.get("time")
                )
        self._writer.flush()

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None
