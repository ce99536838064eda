"""The dense peak TFLOP/s of the GPUs HPC centres run, per precision, as their vendors' datasheets give them: what MFU
is computed against. No torch: the table is data, read on both sides.

Dense figures: NVIDIA's datasheets print the Tensor Core peaks "with sparsity" (2:4 structured), twice the dense
rate a training step can reach; the table holds half of them. fp32 is the plain (non-tensor) rate; tf32 is fp32
matrix products run on the Tensor Cores. AMD's MI250X is two dies (GCDs) that torch sees as two devices: its row is
one GCD, half the card. A device is matched by the name torch gives it (``torch.cuda.get_device_name()``), the most
specific pattern first; ``cluster.gpu_peak_tflops`` gives any other device's peaks.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Mapping, Optional, Tuple

from hpc_train.config.cluster import PEAK_PRECISIONS as PRECISIONS


@dataclass(frozen=True)
class DevicePeak:
    device: str  # the row's name
    tflops: Mapping[str, float]  # precision (PRECISIONS) -> dense peak TFLOP/s of one device
    source: str


def _row(device: str, source: str, **tflops: float) -> DevicePeak:
    return DevicePeak(device, dict(tflops), source)


# (pattern over torch's device name, its peaks), the most specific first.
TABLE: Tuple[Tuple[str, DevicePeak], ...] = (
    (r"V100S", _row("V100S PCIe", "NVIDIA V100S datasheet", fp16=130.0, fp32=16.4)),
    (r"V100.*(PCIE|PCIe)", _row("V100 PCIe", "NVIDIA V100 datasheet", fp16=112.0, fp32=14.0)),
    (r"V100", _row("V100 SXM2", "NVIDIA V100 datasheet", fp16=125.0, fp32=15.7)),
    # A100: SXM and PCIe share their peaks. "MI250X/MI250" is how ROCm names both cards: read as the MI250X.
    (r"A100", _row("A100", "NVIDIA A100 datasheet", bf16=312.0, fp16=312.0, tf32=156.0, fp32=19.5)),
    (r"GH200", _row("GH200", "NVIDIA GH200 datasheet", bf16=989.4, fp16=989.4, tf32=494.7, fp32=66.9)),
    (r"H200 NVL", _row("H200 NVL", "NVIDIA H200 datasheet", bf16=835.5, fp16=835.5, tf32=417.5, fp32=60.0)),
    (r"H200", _row("H200 SXM", "NVIDIA H200 datasheet", bf16=989.4, fp16=989.4, tf32=494.7, fp32=66.9)),
    (r"H100 NVL", _row("H100 NVL", "NVIDIA H100 datasheet", bf16=835.5, fp16=835.5, tf32=417.5, fp32=60.0)),
    (r"H100 PCIe", _row("H100 PCIe", "NVIDIA H100 datasheet", bf16=756.5, fp16=756.5, tf32=378.0, fp32=51.2)),
    (r"H100", _row("H100 SXM", "NVIDIA H100 datasheet", bf16=989.4, fp16=989.4, tf32=494.7, fp32=66.9)),
    (r"B200", _row("B200", "NVIDIA HGX B200 specifications", bf16=2250.0, fp16=2250.0, tf32=1100.0, fp32=75.0)),
    (r"L40S", _row("L40S", "NVIDIA L40S datasheet", bf16=362.05, fp16=362.05, tf32=183.0, fp32=91.6)),
    (r"MI250X?", _row("MI250X (one GCD)", "AMD MI250X data sheet, halved", bf16=191.5, fp16=191.5, fp32=47.85)),
    (r"MI300X", _row("MI300X", "AMD Instinct MI300X data sheet", bf16=1307.4, fp16=1307.4, tf32=653.7, fp32=163.4)),
)


def peak_for(device_name: str) -> Optional[DevicePeak]:
    """The table's row for a device named as torch names it; None for a device the table does not know."""
    for pattern, row in TABLE:
        if re.search(pattern, device_name, flags=re.IGNORECASE):
            return row
    return None


def precision_peak(peak: Mapping[str, float], precision: str) -> Optional[float]:
    """The peak for one precision (None where the device has no such rate, e.g. a V100's bf16)."""
    value = peak.get(precision)
    return float(value) if value is not None else None


__all__ = ["PRECISIONS", "DevicePeak", "TABLE", "peak_for", "precision_peak"]
