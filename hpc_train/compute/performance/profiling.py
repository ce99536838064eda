"""torch.profiler traces of the steps and ranks ``trainer.profile`` chooses, written per rank to
``<run dir>/profile/`` (hpc_train.records.profile_traces): Chrome trace JSON, gzip, with shapes and stacks; on a GPU
with ``trainer.profile.memory=true``, the allocator's history as a memory snapshot beside it (pytorch.org/memory_viz).
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from pathlib import Path
from typing import Any, Iterator, List, Optional

import torch
from torch.profiler import ProfilerActivity, profile, record_function

from hpc_train.compute.performance.settings import ProfileSettings
from hpc_train.compute.performance.step_clock import StepClock
from hpc_train.records import rundir
from hpc_train.records.profile_traces import STEP_PREFIX, memory_snapshot_path, trace_path

log = logging.getLogger("hpc_train")
SNAPSHOT_ENTRIES = 100_000  # allocation events the CUDA allocator's history keeps


@contextlib.contextmanager
def native_output_in_log(run_dir: Path, rank: int) -> Iterator[None]:
    """The process's stderr (file descriptor 2) appended to the rank's log while the profiler starts or stops: the
    profiler library writes its own lines there from C++ (``USDT:... profiler_start``), which no log level silences
    and which are no business of the terminal."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(rundir.rank_log(run_dir, rank), "ab") as log_file:
            os.dup2(log_file.fileno(), 2)
            try:
                yield
            finally:
                sys.stderr.flush()
                os.dup2(saved, 2)
    finally:
        os.close(saved)


class StepProfiler:
    """Starts torch.profiler before the first chosen step and writes the trace after the last one, on a chosen rank;
    marks every profiled step (and, through the clock, its phases) as an annotation."""

    def __init__(
        self, settings: ProfileSettings, rank: int, world_size: int, run_dir: Path, device: torch.device
    ) -> None:
        self.settings, self.rank, self.world_size, self.run_dir, self.device = (
            settings,
            rank,
            world_size,
            run_dir,
            device,
        )
        self.first, self.last = settings.steps if settings.steps is not None else (0, -1)
        self.chosen = settings.chosen(rank)
        self._profile: Optional[Any] = None
        self._step_mark: Optional[Any] = None
        self._last_started = 0  # the last step marked (a run that stops inside the range covers fewer)
        self._memory = bool(settings.memory) and device.type == "cuda"

    def step_boundary(self, next_step: int, clock: StepClock) -> None:
        """The rank starts on `next_step`: the step before it ends (its trace written after the last one)."""
        self._end_mark()
        if self._profile is not None and next_step > self.last:
            with clock.excluded():  # writing the trace is not part of any step
                self._write(clock)
        if self.chosen and next_step == self.first and self._profile is None:
            with clock.excluded():
                self._start(clock)
        if self._profile is not None:
            self._step_mark = record_function(f"{STEP_PREFIX}{next_step}")
            self._step_mark.__enter__()
            self._last_started = next_step

    def finish(self, clock: StepClock) -> None:
        """After the loop (the last step profiled was the run's last, or the run stopped inside the range)."""
        self._end_mark()
        if self._profile is not None:
            self._write(clock)

    def _end_mark(self) -> None:
        if self._step_mark is not None:
            self._step_mark.__exit__(None, None, None)
            self._step_mark = None

    def _start(self, clock: StepClock) -> None:
        os.environ.setdefault("KINETO_LOG_LEVEL", "5")  # silences the profiler library's console chatter
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self.device.type == "cuda" else [])
        if self._memory:
            torch.cuda.memory._record_memory_history(max_entries=SNAPSHOT_ENTRIES)
        self._profile = profile(
            activities=activities, record_shapes=True, with_stack=True, profile_memory=bool(self.settings.memory)
        )
        with native_output_in_log(self.run_dir, self.rank):
            self._profile.__enter__()
        clock.annotate = True
        log.info("profiling steps %d-%d on rank %d", self.first, self.last, self.rank)

    def _write(self, clock: StepClock) -> None:
        prof, self._profile = self._profile, None
        clock.annotate = False
        assert prof is not None
        with native_output_in_log(self.run_dir, self.rank):
            prof.__exit__(None, None, None)
        last = min(self.last, self._last_started)
        path = trace_path(self.run_dir, self.rank, self.first, last)
        written = []
        try:  # a profile is worth less than the run: a full disk or a quota costs the trace, not the training
            path.parent.mkdir(parents=True, exist_ok=True)
            prof.export_chrome_trace(str(path))  # a .gz name: gzip-compressed
            written.append(path)
            if self._memory:
                snapshot = memory_snapshot_path(self.run_dir, self.rank, self.first, last)
                torch.cuda.memory._dump_snapshot(str(snapshot))
                written.append(snapshot)
        except (OSError, RuntimeError) as error:
            log.warning("the profile of steps %d-%d was not written to %s: %s", self.first, last, path.parent, error)
        finally:
            if self._memory:
                torch.cuda.memory._record_memory_history(enabled=None)
        for each in written:
            log.info("profile of steps %d-%d written: %s", self.first, last, each)
        if self.rank == 0:
            self._name_every_trace(last)

    def _name_every_trace(self, last: int) -> None:
        ranks: List[int] = (
            list(range(self.world_size))
            if self.settings.ranks == "all"
            else sorted(int(r) for r in self.settings.ranks)
        )
        others = [trace_path(self.run_dir, rank, self.first, last) for rank in ranks if rank != 0]
        if others:
            log.info("the other profiled ranks write theirs beside it: %s", ", ".join(map(str, others)))
        log.info("read them with: hpc-train-report %s --profile (or load one in https://ui.perfetto.dev)", self.run_dir)
