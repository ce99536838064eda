"""The dense peak TFLOP/s of the GPUs HPC centres run, per precision, as their vendors' datasheets give them: what MFU
is computed against. No torch: the table is data, read on both sides.

Dense figures: NVIDIA's datasheets print the Tensor Core peaks "with sparsity" (2:4 structured), twice the dense
rate a training step can reach; the table holds half of them. fp32 is the plain (non-tensor) rate on NVIDIA's
devices and the matrix rate on AMD's; tf32 is fp32 matrix products run on the Tensor Cores (V100 has none; the
MI200 series has no tf32). An MI250X (and an MI250) is two dies (GCDs) that torch sees as two devices: its row is one
GCD, half the card. A device is matched by the name torch gives it (``torch.cuda.get_device_name()``), the most
specific pattern first, ignoring case; ``cluster.gpu_peak_tflops`` gives any other device's peaks.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from types import MappingProxyType
from typing import Mapping, Optional, Tuple

from hpc_train.config.cluster import PEAK_PRECISIONS as PRECISIONS


@dataclass(frozen=True)
class PeakRow:
    """One row of the table: a device's datasheet peaks (a rank's peak for its run is
    hpc_train.compute.performance.peaks.DevicePeak)."""

    device: str  # the row's name ("H100 SXM")
    tflops: Mapping[str, float]  # precision (PRECISIONS) -> dense peak TFLOP/s of one device (as torch sees it)
    source: str  # where the figures come from


def _row(device: str, source: str, **tflops: float) -> PeakRow:
    return PeakRow(device, MappingProxyType(dict(tflops)), source)


_V100 = "NVIDIA V100 Tensor Core GPU datasheet"
_H100 = "NVIDIA H100 Tensor Core GPU datasheet"
_H200 = "NVIDIA H200 Tensor Core GPU datasheet"
_HOPPER = dict(bf16=989.4, fp16=989.4, tf32=494.7, fp32=66.9)  # H100 SXM, H200 SXM and GH200 share the H100 die's
_NVL = dict(bf16=835.5, fp16=835.5, tf32=417.5, fp32=60.0)  # H100 NVL and H200 NVL

# (pattern searched in torch's device name, ignoring case; its row), the most specific first.
TABLE: Tuple[Tuple[str, PeakRow], ...] = (
    (r"V100S", _row("V100S PCIe", _V100, fp16=130.0, fp32=16.4)),
    (r"V100.*PCIE", _row("V100 PCIe", _V100, fp16=112.0, fp32=14.0)),
    (r"V100", _row("V100 SXM2", _V100, fp16=125.0, fp32=15.7)),
    # A100: the SXM and PCIe cards share their peaks.
    (r"A100", _row("A100", "NVIDIA A100 Tensor Core GPU datasheet", bf16=312.0, fp16=312.0, tf32=156.0, fp32=19.5)),
    (r"GH200", _row("GH200", "NVIDIA GH200 Grace Hopper Superchip datasheet", **_HOPPER)),  # before H200: a substring
    (r"H200 NVL", _row("H200 NVL", _H200, **_NVL)),
    (r"H200", _row("H200 SXM", _H200, **_HOPPER)),
    (r"H100 NVL", _row("H100 NVL", _H100, **_NVL)),
    (r"H100 PCIE", _row("H100 PCIe", _H100, bf16=756.5, fp16=756.5, tf32=378.0, fp32=51.2)),
    (r"H100", _row("H100 SXM", _H100, **_HOPPER)),  # "NVIDIA H100 80GB HBM3"
    (
        r"B200",
        _row(
            "B200",
            "NVIDIA Blackwell architecture technical brief (HGX B200, 1000 W)",
            bf16=2250.0,
            fp16=2250.0,
            tf32=1100.0,
            fp32=80.0,
        ),
    ),
    (r"L40S", _row("L40S", "NVIDIA L40S datasheet", bf16=362.05, fp16=362.05, tf32=183.0, fp32=91.6)),
    # ROCm names both MI200 cards "AMD Instinct MI250X/MI250" on some releases: read as the MI250X (the larger peak).
    (r"MI250X", _row("MI250X (one GCD)", "AMD Instinct MI250X data sheet, halved", bf16=191.5, fp16=191.5, fp32=47.85)),
    (r"MI250", _row("MI250 (one GCD)", "AMD Instinct MI250 data sheet, halved", bf16=181.05, fp16=181.05, fp32=45.25)),
    (
        r"MI300X",
        _row("MI300X", "AMD Instinct MI300X data sheet", bf16=1307.4, fp16=1307.4, tf32=653.7, fp32=163.4),
    ),
)


def peak_for(device_name: str) -> Optional[PeakRow]:
    """The table's row for a device named as torch names it; None for a device the table does not know."""
    for pattern, row in TABLE:
        if re.search(pattern, device_name, flags=re.IGNORECASE):
            return row
    return None


def precision_peak(peak: Mapping[str, float], precision: str) -> Optional[float]:
    """The peak for one precision (None where the device has no such rate, e.g. a V100's bf16)."""
    value = peak.get(precision)
    return float(value) if value is not None else None


__all__ = ["PRECISIONS", "PeakRow", "TABLE", "peak_for", "precision_peak"]
