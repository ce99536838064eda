"""Where a run's time and memory went, as its records carry it: the names of the figures in ``metrics.jsonl``'s
train rows and in ``summary.json``, and their wording for a person (the closing line, the report). No torch here:
the launcher and ``hpc-train-report`` read them on the login node.

A step's phases (:data:`PHASES`): waiting for the next batch, forward and backward (every micro-batch), the optimizer
(gradient norm, clipping, step, schedule, weight average), waiting for a checkpoint. ``other`` is the rest of the
step (logging, the stop-signal check). Communication is not a phase of its own: data parallelism overlaps it with the
backward pass, and telling it apart would take a device synchronisation per step; a profile shows it
(``hpc-train-report RUN_DIR --profile``).
"""

from __future__ import annotations

from typing import Any, Mapping, Optional

from hpc_train.sizes import size_text

PHASES = ("data", "forward_backward", "optimizer", "checkpoint")
OTHER = "other"
SHARE = "{phase}_share"  # a train row's key: the phase's share of a step, averaged over the ranks
# A run waiting for data at least this share of each step is input-bound: its closing line says so.
INPUT_BOUND_SHARE = 0.25
WORDS = {
    "data": "waiting for data",
    "forward_backward": "forward and backward",
    "optimizer": "optimizer",
    "checkpoint": "waiting for checkpoints",
    OTHER: "other",
}

# summary.json's keys (and a train row's, where a row has the figure)
STEP_TIME = "step_time_s"  # seconds per timed optimizer step
FLOPS = "flops_per_step"  # the FLOPs of one optimizer step, every rank's share summed (torch.utils.flop_counter)
TFLOPS = "tflops_per_device"  # achieved TFLOP/s per device
MFU = "mfu"  # model FLOPs utilisation: TFLOPS over the device's dense peak (None: no known peak, e.g. a CPU)
PEAK = "peak_tflops"  # the dense peak per device MFU was computed against, and where it came from
PEAK_SOURCE = "peak_tflops_source"
DEVICE = "device_name"
MEMORY = "peak_memory_bytes"  # the largest rank's peak (a GPU: the allocator's peak allocated; a CPU: resident)
MEMORY_RANK = "peak_memory_rank"
MEMORY_KIND = "peak_memory_kind"  # "allocated" (a GPU's allocator) | "resident" (the process's high-water mark)
MEMORY_PER_RANK = "peak_memory_per_rank"  # [{"rank", "allocated" | "resident", "reserved"}]
# The memory check's record (rundir.MEMORY_ESTIMATE, launch.planning.memory_check.Fit.record), copied in at the end
ESTIMATE = "memory_estimate"
BREAKDOWN = "step_breakdown"  # {phase: share} averaged over the ranks (PHASES and OTHER)
BREAKDOWN_PER_RANK = "step_breakdown_per_rank"  # [{phase: share}] by rank
NUM_WORKERS = "data_num_workers"  # data.num_workers of the run: what an input-bound run's closing line says to raise


def gib(count: Optional[float]) -> str:
    return "n/a" if count is None else size_text(count)


def estimated_peak(summary: Mapping[str, Any]) -> Optional[int]:
    """The memory check's estimate of the largest rank's tensors (what the measured peak is compared with), if any."""
    record = summary.get(ESTIMATE)
    value = record.get("tensor_bytes") if isinstance(record, dict) else None
    return int(value) if isinstance(value, (int, float)) else None


def input_bound_note(summary: Mapping[str, Any], num_workers: Optional[int] = None) -> Optional[str]:
    """ "waiting for data 62 % of each step: raise data.num_workers" when the run is input-bound, else None."""
    share = (summary.get(BREAKDOWN) or {}).get("data")
    if not isinstance(share, (int, float)) or share < INPUT_BOUND_SHARE:
        return None
    now = f" (now {num_workers})" if num_workers is not None else ""
    return f"waiting for data {share * 100:.0f} % of each step: raise data.num_workers{now}"


def mfu_text(summary: Mapping[str, Any]) -> Optional[str]:
    """ "MFU 41.2 % (312 TFLOP/s bf16 peak, NVIDIA A100-SXM4-80GB)", or the achieved rate where no peak is known."""
    achieved = summary.get(TFLOPS)
    if not isinstance(achieved, (int, float)):
        return None
    mfu = summary.get(MFU)
    if mfu is None:
        return f"{_rate(achieved)} per device (MFU n/a: no known peak for {summary.get(DEVICE) or 'this device'})"
    return f"MFU {mfu * 100:.1f} % ({_rate(achieved)} per device of {summary.get(PEAK):g} peak)"


def _rate(tflops: float) -> str:
    return f"{tflops:.3g} TFLOP/s" if tflops >= 0.1 else f"{tflops * 1000:.3g} GFLOP/s"


def breakdown_text(shares: Mapping[str, float]) -> str:
    """ "data 62 %, forward and backward 30 %, optimizer 5 %, ..." (phases over 0.5 %)."""
    parts = [f"{WORDS.get(name, name)} {share * 100:.0f} %" for name, share in shares.items() if share >= 0.005]
    return ", ".join(parts) or "n/a"


def rates_note(row: Mapping[str, Any]) -> str:
    """The live progress line's tail from a train row: samples/s, tokens/s, MFU (or TFLOP/s), the data share."""
    parts = []
    if isinstance(row.get("samples_per_sec"), (int, float)):
        parts.append(f"{row['samples_per_sec']:.1f} samples/s")
    if isinstance(row.get("tokens_per_sec"), (int, float)):
        parts.append(f"{row['tokens_per_sec']:.4g} tokens/s")
    if isinstance(row.get(MFU), (int, float)):
        parts.append(f"MFU {row[MFU] * 100:.1f} %")
    elif isinstance(row.get(TFLOPS), (int, float)):
        parts.append(f"{_rate(row[TFLOPS])}")
    data = row.get(SHARE.format(phase="data"))
    if isinstance(data, (int, float)):
        parts.append(f"data {data * 100:.0f} %")
    return ", ".join(parts)


# The summary's figures hpc-train-report shows for a run (below its table).
REPORTED = (
    STEP_TIME,
    FLOPS,
    TFLOPS,
    MFU,
    PEAK,
    PEAK_SOURCE,
    DEVICE,
    MEMORY,
    MEMORY_RANK,
    MEMORY_KIND,
    MEMORY_PER_RANK,
    BREAKDOWN,
    BREAKDOWN_PER_RANK,
    NUM_WORKERS,
)


def report_lines(figures: Mapping[str, Any]) -> str:
    """A run's performance in a few lines: speed against the peak, memory, where a step's time goes (per rank)."""
    lines = []
    mfu = mfu_text(figures)
    if mfu:
        source = f"; peak from {figures[PEAK_SOURCE]}" if figures.get(PEAK_SOURCE) else ""
        lines.append(f"speed: {mfu}, {figures.get(FLOPS, 0):.3g} FLOPs per step{source}")
    if figures.get(MEMORY):
        kind = figures.get(MEMORY_KIND, "")
        lines.append(f"peak memory: {gib(figures[MEMORY])} {kind} on rank {figures.get(MEMORY_RANK)} (the largest)")
    if figures.get(BREAKDOWN):
        step = figures.get(STEP_TIME)
        each = f"a step ({step * 1000:.1f} ms)" if isinstance(step, (int, float)) else "a step"
        lines.append(f"{each}, averaged over the ranks: {breakdown_text(figures[BREAKDOWN])}")
        per_rank = figures.get(BREAKDOWN_PER_RANK) or []
        if len(per_rank) > 1:
            lines.extend(f"  rank {rank}: {breakdown_text(shares)}" for rank, shares in enumerate(per_rank))
    bound = input_bound_note(figures, figures.get(NUM_WORKERS))
    if bound:
        lines.append(bound)
    return "\n".join(lines)
