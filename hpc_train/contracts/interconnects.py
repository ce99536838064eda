"""The links between ranks, with the bandwidth one rank sends at in a collective over each (NCCL's "bus bandwidth"),
in GB/s: what ``strategy=auto``'s cost model divides a step's communication by (``cluster.interconnect``). No torch.

Nominal figures from the vendors' specifications and published nccl-tests runs, not measured by hpc_train: measure
your cluster's (nccl-tests' ``all_reduce_perf``, its busbw column, inside a node and across two) and give the numbers
in the cluster profile, ``interconnect: {intra: 360, inter: 45}``, and, where the small-message times differ from
:data:`LATENCY_US`'s, ``intra_latency_us`` and ``inter_latency_us``.
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Mapping

INTERCONNECTS: Mapping[str, float] = MappingProxyType(
    {
        "nvlink": 300.0,  # NVLink 3/4 with NVSwitch inside an 8-GPU node (A100: ~230 busbw, H100: ~360-450)
        "pcie": 20.0,  # GPUs talking over PCIe 4.0 x16 (32 GB/s a direction, ~20 reached)
        "infiniband": 25.0,  # one HDR 200 Gb/s adapter per GPU (NDR 400 Gb/s: ~50)
        "ethernet": 3.0,  # 25 GbE (100 GbE with RoCE: ~12)
        "loopback": 1.0,  # CPU workers on one machine: gloo over TCP loopback (benchmarks/auto_layout.py measures it)
    }
)
# Microseconds one collective costs on each link whatever its size (the alpha of the alpha-beta model): nominal, as
# nccl-tests' small-message times show them (gloo on CPU workers: measured by benchmarks/auto_layout.py).
LATENCY_US: Mapping[str, float] = MappingProxyType(
    {"nvlink": 10.0, "pcie": 15.0, "infiniband": 20.0, "ethernet": 50.0, "loopback": 100.0}
)
LINKS = ("intra", "inter")  # inside a node, across nodes
GPU_LINKS: Mapping[str, str] = MappingProxyType({"intra": "nvlink", "inter": "infiniband"})  # GPUs' defaults
CPU_LINKS: Mapping[str, str] = MappingProxyType({"intra": "loopback", "inter": "ethernet"})  # CPU workers' defaults
