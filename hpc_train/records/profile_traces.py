"""The profiler traces' contract (``trainer.profile``), written once: where a rank writes its trace, what the file is
called, and the names the trainer marks its steps and their phases with inside it.

A profiled rank writes one Chrome trace (JSON, gzip; loadable in Perfetto or chrome://tracing) per run attempt that
covered the profiled steps::

    <run dir>/profile/rank<r>.steps<a>-<b>.trace.json.gz
    <run dir>/profile/rank<r>.steps<a>-<b>.memory.pickle     GPU runs with trainer.profile.memory=true

Inside it, each profiled step is a user annotation ``hpc_train.step#<global step>`` and its phases are annotations
named by :data:`PHASES`; ``hpc-train-report RUN_DIR --profile`` reads them (no torch on the login node).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import List, Optional, Tuple

PROFILE = "profile"  # the folder of the run dir the traces go to
STEP_PREFIX = "hpc_train.step#"  # + the global step number (1-based: the step taken)
# A user's script profiled with torch.profiler's schedule and prof.step(): torch marks its steps so.
TORCH_STEP_PREFIX = "ProfilerStep#"
# Each phase of a step the trainer marks, by the annotation's name: waiting for the batch, forward and backward (every
# micro-batch), the optimizer (gradient norm, clipping, step, schedule, weight average), waiting for a checkpoint.
PHASES = {
    "data": "hpc_train.data",
    "forward_backward": "hpc_train.forward_backward",
    "optimizer": "hpc_train.optimizer",
    "checkpoint": "hpc_train.checkpoint",
}
_TRACE = re.compile(r"^rank(\d+)\.steps(\d+)-(\d+)\.trace\.json\.gz$")


def profile_dir(run_dir: Path) -> Path:
    return Path(run_dir) / PROFILE


def trace_path(run_dir: Path, rank: int, first: int, last: int) -> Path:
    return profile_dir(run_dir) / f"rank{rank}.steps{first}-{last}.trace.json.gz"


def memory_snapshot_path(run_dir: Path, rank: int, first: int, last: int) -> Path:
    return profile_dir(run_dir) / f"rank{rank}.steps{first}-{last}.memory.pickle"


def trace_of(path: Path) -> Optional[Tuple[int, int, int]]:
    """(rank, first step, last step) of a trace file's name; None for any other file."""
    match = _TRACE.match(Path(path).name)
    return None if match is None else (int(match[1]), int(match[2]), int(match[3]))


def list_traces(run_dir: Path) -> List[Path]:
    """The run's traces, by rank then first step."""
    folder = profile_dir(run_dir)
    found = [(trace_of(path), path) for path in folder.glob("*.trace.json.gz")] if folder.is_dir() else []
    return [path for key, path in sorted(found) if key is not None]


def step_number(name: str) -> Optional[int]:
    """The step of a step annotation's name (hpc_train's, or torch.profiler's own in a user's script); None for any
    other event."""
    prefix = next((p for p in (STEP_PREFIX, TORCH_STEP_PREFIX) if name.startswith(p)), None)
    if prefix is None:
        return None
    tail = name[len(prefix) :]
    return int(tail) if tail.isdigit() else None
