"""The dense peak FLOP/s of the device a rank computes on, for the run's precision: cluster.gpu_peak_tflops when the
profile sets it, else hpc_train's table by the device's name (hpc_train.contracts.gpu_peaks); none for a CPU."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Optional

import torch

from hpc_train.contracts.gpu_peaks import peak_for, precision_peak

PRECISION_KEYS = {"bf16": "bf16", "16": "fp16"}  # trainer.precision -> the table's column ("32": tf32 or fp32)


@dataclass(frozen=True)
class DevicePeak:
    """The peak a rank's MFU is computed against: its device's, for the run's precision (the table's rows:
    hpc_train.contracts.gpu_peaks.PeakRow)."""

    name: str  # the device's name as torch reports it ("cpu" for a CPU)
    tflops: Optional[float]  # None: no known peak (a CPU, a device the table lacks)
    source: Optional[str]


def column(precision: str) -> str:
    """The peak that bounds a run of `precision`: fp32 matrix products run as tf32 when torch allows it."""
    if precision in PRECISION_KEYS:
        return PRECISION_KEYS[precision]
    return "fp32" if torch.get_float32_matmul_precision() == "highest" else "tf32"


def device_peak(device: torch.device, precision: str, override: Optional[Mapping[str, float]]) -> DevicePeak:
    key = column(precision)
    if device.type != "cuda":
        return DevicePeak(device.type, None, None)
    name = torch.cuda.get_device_name(device)
    if override and override.get(key) is not None:
        return DevicePeak(name, float(override[key]), "cluster.gpu_peak_tflops")
    row = peak_for(name)
    value = precision_peak(row.tflops, key) if row is not None else None
    return DevicePeak(name, value, f"{row.device}: {row.source}" if row is not None and value else None)
