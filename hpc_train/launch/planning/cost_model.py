"""The step time ``strategy=auto`` ranks layouts by, from each rank's counted costs (no torch).

The memory estimate counts, for one rank of each pipeline stage, one training step's FLOPs, the bytes its
collectives send by kind and link, and how many it issues per link (``hpc_train.compute.fit.costs``). A rank's step
time is then

    compute  = FLOPs / (the device's peak FLOP/s x strategy.efficiency)
    comm     = per link (intra: inside a node, inter: across nodes): bytes / bandwidth + collectives x latency
    bubble   = compute x (pp - 1) / chunks        (gpipe and 1F1B: the idle share (pp - 1) / (chunks + pp - 1))
    step     = compute + comm + bubble

and a layout's is its slowest estimated rank's. Communication is not assumed to overlap computation (FSDP2 and DDP
overlap some of it: the model ranks layouts, it does not predict a run's time to the second). CPU workers that
outnumber the machine's cores share them: a rank waiting in the pipeline's bubble leaves its core to the others, so
the bubble costs no time there (``Rates.idle_is_free``).

The device's peak: ``cluster.gpu_peak_tflops``, else hpc_train's table by ``cluster.gpu_type``
(``hpc_train.contracts.gpu_peaks``), for the run's precision; CPU workers: ``cluster.cpu_gflops``. The links'
bandwidths: ``cluster.interconnect`` ({intra: ..., inter: ...}, each a link of
``hpc_train.contracts.interconnects.INTERCONNECTS`` or GB/s).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Optional, Sequence

from hpc_train.config.errors import ConfigError
from hpc_train.contracts.gpu_peaks import peak_for, precision_peak
from hpc_train.contracts.interconnects import CPU_LINKS, GPU_LINKS, INTERCONNECTS, LATENCY_US, LINKS

CPU_GFLOPS = 20.0  # a CPU worker's sustained GFLOP/s when cluster.cpu_gflops is null (measure yours)
GPU_TFLOPS = 300.0  # the peak assumed for a GPU neither cluster.gpu_peak_tflops nor gpu_type names
PRECISION_COLUMNS = {"bf16": "bf16", "16": "fp16", "32": "tf32"}  # trainer.precision -> the peaks table's column


@dataclass(frozen=True)
class Rates:
    """What the step time divides by: FLOP/s one rank sustains, bytes/s and seconds a collective per link."""

    flops_per_s: float
    bytes_per_s: Mapping[str, float]  # link (intra, inter) -> bandwidth
    latency_s: Mapping[str, float]  # link -> what one collective costs whatever its size
    source: str  # where the figures come from, in words
    idle_is_free: bool = False  # CPU workers sharing fewer cores: a rank's idle time is another's compute

    def comm_time(self, link: str, count: float, messages: float) -> float:
        link = link if link in LINKS else "intra"
        return count / self.bytes_per_s[link] + messages * self.latency_s[link]


@dataclass(frozen=True)
class StepTime:
    """One layout's modelled step, in seconds, and its parts (its slowest rank's)."""

    compute: float
    comm: float
    bubble: float

    @property
    def total(self) -> float:
        return self.compute + self.comm + self.bubble

    def describe(self) -> str:
        parts = f"compute {_ms(self.compute)} + comm {_ms(self.comm)}"
        return f"{_ms(self.total)} ({parts}" + (f" + bubble {_ms(self.bubble)})" if self.bubble else ")")


def rates_for(
    cluster: Mapping[str, Any], precision: str, efficiency: float, on_cpus: bool, shared_cores: bool = False
) -> Rates:
    """The rates of the job's devices and links from its (checked) cluster profile; `shared_cores`: CPU workers that
    outnumber the cores."""
    given = dict(cluster.get("interconnect") or {})
    links = {link: given.get(link, (CPU_LINKS if on_cpus else GPU_LINKS)[link]) for link in LINKS}
    bandwidth = {link: _gb_per_s(links[link], link) * 1e9 for link in LINKS}
    latency = {link: _latency_us(given, links[link], link) * 1e-6 for link in LINKS}
    words = f"links {links['intra']}, {links['inter']}"
    if on_cpus:
        gflops = cluster.get("cpu_gflops")
        peak = (float(gflops) if gflops is not None else CPU_GFLOPS) * 1e9
        shared = "; workers share the cores" if shared_cores else ""
        return Rates(peak, bandwidth, latency, f"CPU worker {peak / 1e9:g} GFLOP/s; {words}{shared}", shared_cores)
    tflops, what = _gpu_tflops(cluster, PRECISION_COLUMNS.get(precision, "tf32"))
    return Rates(tflops * 1e12 * efficiency, bandwidth, latency, f"{what} x {efficiency:g}; {words}")


def step_time(ranks: Sequence[Mapping[str, Any]], rates: Rates, pp: int = 1, chunks: int = 1) -> StepTime:
    """The slowest of `ranks` (the estimate's per-rank dicts, with ``flops`` and ``comm``) as a StepTime."""
    times = [_rank_time(rank, rates, pp, chunks) for rank in ranks]
    return max(times, key=lambda time: time.total)


def _rank_time(rank: Mapping[str, Any], rates: Rates, pp: int, chunks: int) -> StepTime:
    compute = float(rank.get("flops", 0)) / rates.flops_per_s
    sent: dict = {}
    for links in dict(rank.get("comm") or {}).values():
        for link, count in links.items():
            sent[link] = sent.get(link, 0) + count
    messages = dict(rank.get("messages") or {})
    comm = sum(rates.comm_time(link, sent.get(link, 0), messages.get(link, 0)) for link in {*sent, *messages})
    bubble = compute * (pp - 1) / max(chunks, 1) if pp > 1 and not rates.idle_is_free else 0.0
    return StepTime(compute, comm, bubble)


def _latency_us(given: Mapping[str, Any], value: Any, link: str) -> float:
    """cluster.interconnect's LINK_latency_us, else the named link's, else (a bare bandwidth) infiniband's."""
    if given.get(f"{link}_latency_us") is not None:
        return float(given[f"{link}_latency_us"])
    return LATENCY_US.get(str(value).lower(), LATENCY_US["infiniband"])


def _gb_per_s(value: Any, link: str) -> float:
    """A link's GB/s from cluster.interconnect's value: a number, or a link the table knows (ConfigError else)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if str(value).lower() in INTERCONNECTS:
        return INTERCONNECTS[str(value).lower()]
    raise ConfigError(
        f"cluster.interconnect.{link}",
        f"is {value!r}, neither a link hpc_train knows ({', '.join(INTERCONNECTS)}) nor a bandwidth in GB/s.",
        f"give cluster.interconnect.{link}=infiniband (a link) or cluster.interconnect.{link}=25 (GB/s a rank sends).",
    )


def _gpu_tflops(cluster: Mapping[str, Any], column: str) -> "tuple[float, str]":
    """The GPU's dense peak TFLOP/s for `column`: cluster.gpu_peak_tflops, the table's row for cluster.gpu_type,
    else :data:`GPU_TFLOPS`; with where it came from."""
    given = cluster.get("gpu_peak_tflops")
    if given:
        value = precision_peak(dict(given), column) or max(float(v) for v in dict(given).values())
        return value, f"cluster.gpu_peak_tflops {value:g} TFLOP/s"
    gpu = cluster.get("gpu_type")
    row = peak_for(str(gpu)) if gpu else None
    value: Optional[float] = precision_peak(row.tflops, column) if row is not None else None
    if row is not None and value is not None:
        return value, f"{row.device} {value:g} TFLOP/s ({column})"
    return GPU_TFLOPS, f"an assumed {GPU_TFLOPS:g} TFLOP/s (set cluster.gpu_peak_tflops or cluster.gpu_type)"


def _ms(seconds: float) -> str:
    if seconds < 1e-3:
        return f"{seconds * 1e6:.0f} us"
    return f"{seconds * 1e3:.1f} ms" if seconds < 10 else f"{seconds:.1f} s"
