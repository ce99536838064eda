"""Where a rank's steps spend their time: seconds per phase (hpc_train.records.performance.PHASES), per step.

A step runs from the moment the rank starts waiting for its batch to the moment it starts waiting for the next one,
evaluation excluded. On a CPU every phase is timed on the host. On a GPU, forward-backward and the optimizer are timed
by CUDA events recorded around them on the current stream, read only when a window is closed (at a logged step, which
synchronises anyway): the device is never synchronised for the clock. Waiting for data and for a checkpoint is host
time on both.
"""

from __future__ import annotations

import contextlib
import time
from typing import Dict, Iterator, List, Optional, Tuple

import torch
from torch.profiler import record_function

from hpc_train.records.performance import PHASES
from hpc_train.records.profile_traces import PHASES as ANNOTATIONS

GPU_TIMED = ("forward_backward", "optimizer")


class Window:
    """Totals over some steps: wall seconds, steps, seconds per phase."""

    def __init__(self) -> None:
        self.wall, self.steps = 0.0, 0
        self.phases: Dict[str, float] = {phase: 0.0 for phase in PHASES}

    def add(self, wall: float, phases: Dict[str, float]) -> None:
        self.wall += wall
        self.steps += 1
        for name, seconds in phases.items():
            self.phases[name] += seconds

    def vector(self) -> List[float]:
        return [self.wall, float(self.steps), *(self.phases[phase] for phase in PHASES)]


class StepClock:
    def __init__(self, device: torch.device, first_timed_step: int) -> None:
        self.cuda = device.type == "cuda"
        self.first_timed_step = first_timed_step  # steps before it (the warm-up) count in windows, not in the run
        self.window, self.run = Window(), Window()
        self.annotate = False  # a profile is being recorded: each phase is an annotation too
        self._step: Optional[int] = None  # the step in progress (its number once taken)
        self._started = 0.0
        self._excluded = 0.0
        self._phases: Dict[str, float] = {}
        self._events: List[Tuple[int, str, "torch.cuda.Event", "torch.cuda.Event"]] = []  # (step, phase, start, end)
        self._closed: List[Tuple[int, float]] = []  # closed steps awaiting their GPU phases: (step, wall)
        self._host: Dict[int, Dict[str, float]] = {}  # their host-timed phases, by step

    def step_boundary(self, next_step: int) -> None:
        """The rank starts waiting for the batch of `next_step`: the step before it ends here."""
        now = time.perf_counter()
        if self._step is not None:
            self._close(self._step, now - self._started - self._excluded)
        self._step, self._started, self._excluded, self._phases = next_step, now, 0.0, {}

    def finish(self) -> None:
        """After the last step of the loop."""
        if self._step is not None:
            self._close(self._step, time.perf_counter() - self._started - self._excluded)
            self._step = None

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        annotation = record_function(ANNOTATIONS[name]) if self.annotate else contextlib.nullcontext()
        with annotation:
            if self.cuda and name in GPU_TIMED:
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                yield
                end.record()
                self._events.append((self._step or 0, name, start, end))
                return
            started = time.perf_counter()
            yield
            self._phases[name] = self._phases.get(name, 0.0) + time.perf_counter() - started

    @contextlib.contextmanager
    def excluded(self) -> Iterator[None]:
        """Time inside the block is not part of the step (an evaluation between steps)."""
        started = time.perf_counter()
        try:
            yield
        finally:
            self._excluded += time.perf_counter() - started

    def _close(self, step: int, wall: float) -> None:
        phases = self._phases
        if self.cuda:  # its GPU phases are read when the window is
            self._closed.append((step, wall))
            self._host[step] = phases
            return
        self._count(step, wall, phases)

    def _count(self, step: int, wall: float, phases: Dict[str, float]) -> None:
        self.window.add(wall, phases)
        if step >= self.first_timed_step:
            self.run.add(wall, phases)

    def take_window(self) -> Window:
        """The steps closed since the last window (their GPU phases read now), and a new window."""
        if self._closed:
            last = self._closed[-1][0]
            done = [event for event in self._events if event[0] <= last]
            self._events = [event for event in self._events if event[0] > last]
            if done:
                done[-1][3].synchronize()  # recorded before this point; usually long finished
            gpu: Dict[int, Dict[str, float]] = {}
            for step, name, start, end in done:
                seconds = start.elapsed_time(end) / 1000.0
                per_step = gpu.setdefault(step, {})
                per_step[name] = per_step.get(name, 0.0) + seconds
            for step, wall in self._closed:
                self._count(step, wall, {**self._host.pop(step, {}), **gpu.get(step, {})})
            self._closed = []
        window, self.window = self.window, Window()
        return window
