"""Per-rank log files, the rank-0 progress bar and the rank-0 metrics/summary files."""

from __future__ import annotations

import json
import logging
import sys
import time
from pathlib import Path
from typing import Any, Dict, Optional

from hpc_train import rundir


def setup_logging(run_dir: Path, rank: int) -> logging.Logger:
    """Every rank logs to ``logs/rank<r>.log``; rank 0 also to the console."""
    path = rundir.rank_log(run_dir, rank)
    path.parent.mkdir(parents=True, exist_ok=True)
    logger = logging.getLogger("hpc_train")
    logger.handlers.clear()
    logger.setLevel(logging.INFO)
    logger.propagate = False
    fmt = logging.Formatter(f"%(asctime)s [rank {rank}] %(levelname)s %(message)s")
    file_handler = logging.FileHandler(path)
    file_handler.setFormatter(fmt)
    logger.addHandler(file_handler)
    if rank == 0:
        console = logging.StreamHandler(sys.stdout)
        console.setFormatter(logging.Formatter("hpc-train: %(message)s"))
        logger.addHandler(console)
    return logger


def log_to_file(message: str, level: int = logging.ERROR) -> None:
    """Into this rank's log file only, for what is also said on the console another way (rank 0's console copy
    would say it twice)."""
    logger = logging.getLogger("hpc_train")
    record = logger.makeRecord(logger.name, level, __file__, 0, "%s", (message,), None)
    for handler in logger.handlers:
        if isinstance(handler, logging.FileHandler):
            handler.handle(record)


class Progress:
    """A dependency-free progress bar: redraws in place on a terminal, prints sparse lines otherwise."""

    def __init__(self, total: int, enabled: bool, every: int = 10) -> None:
        self.total = max(1, total)
        self.enabled = enabled
        self.tty = sys.stderr.isatty()
        self.every = max(1, every)
        self.start = time.monotonic()

    def update(self, step: int, loss: Optional[float] = None) -> None:
        if not self.enabled or (not self.tty and step % self.every and step != self.total):
            return
        frac = min(1.0, step / self.total)
        bar = "#" * int(30 * frac) + "-" * (30 - int(30 * frac))
        elapsed = time.monotonic() - self.start
        loss_text = "" if loss is None else f" loss {loss:.4f}"
        line = f"[{bar}] {step}/{self.total} {elapsed:6.1f}s{loss_text}"
        if self.tty:
            sys.stderr.write("\r" + line)
            if step >= self.total:
                sys.stderr.write("\n")
        else:
            sys.stderr.write(line + "\n")
        sys.stderr.flush()

    def close(self) -> None:
        if self.enabled and self.tty:
            sys.stderr.write("\n")
            sys.stderr.flush()


class MetricsWriter:
    """Rank 0 appends one JSON object per logged step/epoch to ``metrics.jsonl``."""

    def __init__(self, run_dir: Path, enabled: bool) -> None:
        self.path = run_dir / rundir.METRICS
        self.enabled = enabled

    def write(self, record: Dict[str, Any]) -> None:
        if not self.enabled:
            return
        with open(self.path, "a") as handle:
            handle.write(json.dumps(record) + "\n")

    def close(self) -> None:
        """Called once when training ends (after summary.json is written); trackers finish their run here."""


def truncate_metrics(run_dir: Path, last_step: int, keep_eval_at_last: bool) -> None:
    """Drop metrics.jsonl lines the resumed run will write again: lines past `last_step` (an attempt
    that died after its last checkpoint), and the eval at `last_step` unless it came before that checkpoint."""
    path = run_dir / rundir.METRICS
    if not path.exists():
        return
    kept = []
    for line in path.read_text().splitlines():
        try:
            record = json.loads(line)
            step = record.get("step", 0)
            if step < last_step or (step == last_step and (record.get("kind") != "eval" or keep_eval_at_last)):
                kept.append(line)
        except json.JSONDecodeError:
            continue
    rundir.write_text_atomic(path, "".join(k + "\n" for k in kept))
