"""summary.json: what a finished run says of itself (rank 0 writes it; the launcher's closing line and
hpc-train-report read it)."""

from __future__ import annotations

from typing import Any, Dict, Optional, Sequence

import torch

from hpc_train.compute.training.state import TrainState
from hpc_train.compute.training.throughput import Throughput
from hpc_train.containers.inside import image_record


def run_summary(
    identity: Dict[str, Any],
    state: TrainState,
    metric_names: Sequence[str],
    ema: Dict[str, Any],
    meter: Throughput,
    tokens_per_sec: Optional[float],
    global_batch: int,
    performance: Dict[str, Any],
    record: Dict[str, Any],
) -> Dict[str, Any]:
    """`identity`: strategy, model, data, sizes, precision, device; `record`: resume, checkpoint and attempt facts."""
    last_eval = state.last_eval
    return {
        **identity,
        "global_step": state.global_step,
        "epochs_completed": state.epoch,
        "train_loss": state.last_loss,
        "eval_accuracy": None if last_eval is None else last_eval["accuracy"],
        "eval_loss": None if last_eval is None else last_eval["loss"],
        **{f"train_{name}": value for name, value in state.last_metrics.items()},
        **{f"eval_{name}": (last_eval or {}).get(name) for name in metric_names},
        **ema,
        "samples_per_sec": meter.samples_per_sec,
        "images_per_sec": meter.samples_per_sec,  # the old name of samples_per_sec, kept for one release
        **({"tokens_per_sec": tokens_per_sec} if tokens_per_sec is not None else {}),
        "timed_steps": meter.samples // global_batch,
        **performance,
        **record,
        "torch_version": torch.__version__,
        "python": image_record(),
    }


def seconds_per_step(meter: Throughput, global_batch: int) -> Optional[float]:
    """The timed steps' mean duration (None before any was timed)."""
    steps = meter.samples // global_batch
    return meter.elapsed / steps if steps else None
