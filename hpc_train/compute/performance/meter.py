"""A rank's performance figures, as its train rows and its summary carry them (hpc_train.records.performance).

Every rank counts the FLOPs of its first step, times its steps' phases and knows its peak memory; at each logged step
and at the end, one gather brings every rank's numbers to rank 0, which writes them: the breakdown averaged over the
ranks (and per rank in the summary), the largest rank's peak memory, the achieved TFLOP/s per device and MFU.
"""

from __future__ import annotations

import contextlib
import logging
from pathlib import Path
from typing import Any, ContextManager, Dict, Iterator, List, Mapping, Optional

import torch

from hpc_train.compute.performance import memory
from hpc_train.compute.performance.flops import StepFlops
from hpc_train.compute.performance.peaks import device_peak
from hpc_train.compute.performance.profiling import StepProfiler
from hpc_train.compute.performance.settings import ProfileSettings
from hpc_train.compute.performance.step_clock import StepClock, Window
from hpc_train.compute.runtime import distributed
from hpc_train.compute.runtime.ranks import RankInfo
from hpc_train.records import performance as names
from hpc_train.records.performance import OTHER, PHASES, SHARE

log = logging.getLogger("hpc_train")
# The places of a rank's numbers in its gathered vector: a window's wall seconds and steps, each phase's seconds
# (from 2, PHASES' order), then its peak memory, reserved memory, FLOPs per step and device count.
_WALL, _STEPS = 0, 1
_MEMORY, _RESERVED, _FLOPS, _DEVICES = (2 + len(PHASES) + index for index in range(4))


class PerformanceMeter:
    def __init__(
        self,
        profile: ProfileSettings,
        peak_override: Optional[Mapping[str, float]],
        precision: str,
        ranks: RankInfo,
        devices: List[torch.device],
        run_dir: Path,
        first_timed_step: int,
    ) -> None:
        self.rank, self.device, self.device_count = ranks.rank, devices[0], len(devices)
        self.clock = StepClock(self.device, first_timed_step)
        self.flops = StepFlops()
        self.profiler = StepProfiler(profile, ranks.rank, ranks.world_size, run_dir, self.device)
        self.peak = device_peak(self.device, precision, peak_override)

    # -- in the loop ------------------------------------------------------------------------
    def step_boundary(self, next_step: int) -> None:
        """This rank starts waiting for the batch of `next_step`."""
        self.clock.step_boundary(next_step)
        self.profiler.step_boundary(next_step, self.clock)

    def phase(self, name: str) -> ContextManager[None]:
        return self.clock.phase(name)

    def excluded(self) -> ContextManager[None]:
        return self.clock.excluded()

    @contextlib.contextmanager
    def forward_backward(self, step: int) -> Iterator[None]:
        """Around a step's forward and backward: timed, its FLOPs counted when due (an attempt's second step), an
        out-of-memory error named."""
        with memory.out_of_memory_named(self.rank, step, self.device), self.phase("forward_backward"):
            with self.flops.counting():
                yield

    def finish(self) -> None:
        """After the loop: the step in progress ends, a trace still open is written."""
        self.clock.finish()
        self.profiler.finish(self.clock)

    # -- gathered ---------------------------------------------------------------------------
    def window_fields(self) -> Dict[str, Any]:
        """The figures of the steps since the last logged one, for a train row (on rank 0; every rank calls it)."""
        window = self.clock.take_window()
        gathered = self._gather(window)
        if gathered is None or not window.steps:
            return {}
        step_time = gathered[0][_WALL] / max(1.0, gathered[0][_STEPS])
        shares = [self._shares(row) for row in gathered]
        fields: Dict[str, Any] = {names.STEP_TIME: step_time}
        fields.update({SHARE.format(phase=name): _mean(shares, name) for name in (*PHASES, OTHER)})
        figures = self._compute_figures(gathered, step_time)
        fields.update({key: value for key, value in figures.items() if key not in (names.PEAK, names.PEAK_SOURCE)})
        fields[names.MEMORY] = max(int(row[_MEMORY]) for row in gathered)
        return fields

    def summary_fields(self, step_time: Optional[float]) -> Dict[str, Any]:
        """The run's figures over its timed steps, for summary.json (on rank 0; every rank calls it). `step_time`: the
        throughput meter's seconds per timed step."""
        self.clock.take_window()  # a GPU's last steps read into the run's totals
        gathered = self._gather(self.clock.run)
        if gathered is None:
            return {}
        shares = [self._shares(row) for row in gathered]
        largest = max(range(len(gathered)), key=lambda rank: gathered[rank][_MEMORY])
        kind = "allocated" if self.device.type == "cuda" else "resident"
        fields: Dict[str, Any] = {
            names.STEP_TIME: step_time,
            names.BREAKDOWN: {name: _mean(shares, name) for name in (*PHASES, OTHER)},
            names.BREAKDOWN_PER_RANK: shares,
            names.MEMORY: int(gathered[largest][_MEMORY]),
            names.MEMORY_RANK: largest,
            names.MEMORY_KIND: kind,
            names.MEMORY_PER_RANK: [
                {"rank": rank, kind: int(row[_MEMORY]), **({"reserved": int(row[_RESERVED])} if row[_RESERVED] else {})}
                for rank, row in enumerate(gathered)
            ],
            names.DEVICE: self.peak.name,
        }
        if step_time:
            fields.update(self._compute_figures(gathered, step_time))
        return fields

    def _gather(self, window: Window) -> Optional[List[List[float]]]:
        seen = memory.peak(self.device)
        main = seen.get("allocated", seen.get("resident", 0))
        flops = float(self.flops.per_step) if self.flops.per_step is not None else -1.0
        vector = [*window.vector(), float(main), float(seen.get("reserved", 0)), flops, float(self.device_count)]
        return distributed.gather_floats_to_main(vector)

    @staticmethod
    def _shares(row: List[float]) -> Dict[str, float]:
        wall = row[_WALL]
        if wall <= 0:
            return {name: 0.0 for name in (*PHASES, OTHER)}
        shares = {name: row[2 + index] / wall for index, name in enumerate(PHASES)}
        timed = sum(shares.values())
        if timed > 1.0:  # a GPU's event-timed phases can outlast the host's step a little (queued work)
            shares = {name: share / timed for name, share in shares.items()}
        shares[OTHER] = max(0.0, 1.0 - sum(shares.values()))
        return shares

    def _compute_figures(self, gathered: List[List[float]], step_time: float) -> Dict[str, Any]:
        """FLOPs per step (every rank's), TFLOP/s per device, MFU against the peak (None without one)."""
        if any(row[_FLOPS] < 0 for row in gathered) or step_time <= 0:
            return {}
        total = sum(row[_FLOPS] for row in gathered)
        tflops = total / sum(row[_DEVICES] for row in gathered) / step_time / 1e12
        peak = self.peak.tflops
        return {
            names.FLOPS: int(total),
            names.TFLOPS: tflops,
            names.MFU: tflops / peak if peak else None,
            names.PEAK: peak,
            names.PEAK_SOURCE: self.peak.source if peak else None,
        }


def _mean(shares: List[Dict[str, float]], name: str) -> float:
    return sum(row[name] for row in shares) / max(1, len(shares))
