"""Per-rank log files, the rank-0 progress bar and the rank-0 metrics/summary files."""

from __future__ import annotations

import json
import logging
import sys
import threading
import time
from pathlib import Path
from typing import Any, Dict, Optional

from tqdm import tqdm

from hpc_train.records import rundir


class RankLogHandler(logging.FileHandler):
    """A rank's log file that a full disk stops: no traceback of logging's own (``--- Logging error ---``), nothing
    more written, and the rank's main thread stops with one message (RecordNotWritten) at its next line; a line
    logged by another thread meanwhile only marks it."""

    full = False  # the disk filled while writing a line: nothing more is written
    told = False  # RecordNotWritten raised (once, in the main thread)

    def emit(self, record: logging.LogRecord) -> None:
        if self.full:
            self._tell(sys.exc_info()[1])
            return
        super().emit(record)

    def handleError(self, record: logging.LogRecord) -> None:
        err = sys.exc_info()[1]
        if not isinstance(err, OSError) or err.errno not in rundir.DISK_FULL_ERRNOS:
            super().handleError(record)
            return
        self.full = True
        self._tell(err.__context__)

    def _tell(self, handling: Optional[BaseException]) -> None:
        """Raise once, in the main thread, and never over an error being handled (a failing rank's last lines: the
        first error is the message)."""
        if self.told or handling is not None or threading.current_thread() is not threading.main_thread():
            return
        self.told = True
        raise rundir.RecordNotWritten(rundir.no_space_message(Path(self.baseFilename), LOG_KEPT))


LOG_KEPT = "the log's lines before it are kept, and the checkpoints and metrics with them"


def setup_logging(run_dir: Path, rank: int) -> logging.Logger:
    """Every rank logs to ``logs/rank<r>.log``; rank 0 also to the console."""
    path = rundir.rank_log(run_dir, rank)
    path.parent.mkdir(parents=True, exist_ok=True)
    logger = logging.getLogger("hpc_train")
    logger.handlers.clear()
    logger.setLevel(logging.INFO)
    logger.propagate = False
    fmt = logging.Formatter(f"%(asctime)s [rank {rank}] %(levelname)s %(message)s")
    file_handler = RankLogHandler(path)
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
    """Rank 0's progress bar, drawn by tqdm: redrawn in place on a terminal (steps, rate, time left, the loss);
    elsewhere (a job's log file) one line every `every` steps and at the last one, worded as ever:
    ``[#####-----] step/total  elapsed s loss x``. `start`: the step a resumed run starts from."""

    LINE = "[{bar:30}] {step}/{steps} {elapsed_s:6.1f}s{loss}{rates}"  # the log file's line; tqdm draws its bar

    def __init__(self, total: int, enabled: bool, every: int = 10, start: int = 0) -> None:
        self.total = max(1, total)
        self.enabled = enabled
        self.tty = sys.stderr.isatty()
        self.every = max(1, every)
        self.start = time.monotonic()
        self.bar = None
        if enabled and self.tty:
            self.bar = tqdm(
                total=self.total, initial=min(start, self.total), unit="step", file=sys.stderr, dynamic_ncols=True
            )

    def update(self, step: int, loss: Optional[float] = None, rates: str = "") -> None:
        """`rates`: the throughput of the last logged step, in words (samples/s, tokens/s, MFU, data share)."""
        if not self.enabled:
            return
        if self.bar is not None:
            if loss is not None:
                self.bar.set_postfix_str(f"loss {loss:.4f}" + (f", {rates}" if rates else ""), refresh=False)
            self.bar.update(min(step, self.total) - self.bar.n)
            if step >= self.total:
                self.close()
            return
        if step % self.every and step != self.total:
            return
        line = tqdm.format_meter(
            min(step, self.total),
            self.total,
            time.monotonic() - self.start,
            bar_format=self.LINE,
            ascii="-#",
            step=step,
            steps=self.total,
            loss="" if loss is None else f" loss {loss:.4f}",
            rates=f"  {rates}" if rates else "",
        )
        sys.stderr.write(line + "\n")
        sys.stderr.flush()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None


METRICS_KEPT = "every row written before this one is kept whole, and the checkpoints with it"


class MetricsWriter:
    """Rank 0 appends one JSON object per logged step/epoch to ``metrics.jsonl``."""

    def __init__(self, run_dir: Path, enabled: bool) -> None:
        self.path = run_dir / rundir.METRICS
        self.enabled = enabled

    def write(self, record: Dict[str, Any]) -> None:
        if not self.enabled:
            return
        with rundir.recording(self.path, METRICS_KEPT):
            rundir.append_whole(self.path, json.dumps(record) + "\n")

    def flush(self) -> None:
        """Called before every checkpoint and at the stop signal: the rows written so far survive a kill -9 of this
        process from then on. metrics.jsonl needs nothing: each row is appended by a write the kernel keeps."""

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
