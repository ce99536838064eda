"""The memory of the GPUs HPC centres run, and what their device holds beyond tensors: what the memory check before
queueing compares a job's estimate against. No torch: the table is data, read on the login side.

A GPU type (``cluster.gpu_type``: v100, a100, h100 ...) has one or more sizes, each the memory its datasheet names in
GB (``cluster.gpu_memory_gb``: 32 for a V100 32GB) and the memory the allocator can use on it, in GiB, as torch
reports it (``torch.cuda.get_device_properties(0).total_memory``; its out-of-memory message's "total capacity"):
less than the datasheet's figure, the driver keeping some. A type sold in several sizes (v100 16 or 32, a100 40 or
80) needs ``cluster.gpu_memory_gb`` to say which; a size the table does not know is read as that many GiB, less the
largest share the driver keeps on the table's GPUs.

Beyond its tensors, a rank's process holds, per device family (:data:`FAMILIES`): the CUDA (or HIP) context, NCCL's
(RCCL's) buffers for each communicator it joins when there are several ranks, and the caching allocator's slack
(memory reserved in blocks beyond what the tensors take, as a share of their peak).
"""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType
from typing import Mapping, Optional, Tuple

from hpc_train.errors import ConfigError
from hpc_train.sizes import GIB, size_text

MEMORY_KEY = "cluster.gpu_memory_gb"


@dataclass(frozen=True)
class Family:
    """What one device family's process holds beyond its tensors, each figure with where it comes from."""

    name: str
    context_gib: float  # the CUDA/HIP context (kernels loaded lazily, as torch loads them by default)
    communicator_gib: float  # NCCL/RCCL buffers per communicator of a job with several ranks
    slack: float  # the caching allocator's reserved memory beyond its peak allocated, as a share of that peak
    source: str


_NCCL = (
    "NCCL's buffers: NCCL_BUFFSIZE (4 MiB by default) per channel and peer, send and receive (NCCL's environment"
    " variables documentation); up to 32 channels on NVLink/NVSwitch"
)
_SLACK = (
    "the caching allocator rounds blocks up (512 B; 2 MiB and 20 MiB segments) and keeps freed blocks cached"
    " (PyTorch's CUDA semantics, memory management): reserved over allocated is commonly 5-15 % in training"
)
_CONTEXT = "nvidia-smi's memory of a process that only initialised CUDA, with lazy module loading (torch's default)"

FAMILIES: Mapping[str, Family] = MappingProxyType(
    {
        "volta": Family("volta", 0.3, 0.25, 0.10, f"{_CONTEXT}; {_NCCL} (NVLink 2, fewer channels); {_SLACK}"),
        "ampere": Family("ampere", 0.45, 0.5, 0.10, f"{_CONTEXT}; {_NCCL}; {_SLACK}"),
        "ada": Family("ada", 0.45, 0.25, 0.10, f"{_CONTEXT}; {_NCCL} (PCIe); {_SLACK}"),
        "hopper": Family("hopper", 0.5, 1.0, 0.10, f"{_CONTEXT}; {_NCCL}, and NVLink SHARP (NVLS) buffers; {_SLACK}"),
        "blackwell": Family("blackwell", 0.5, 1.0, 0.10, f"{_CONTEXT}; {_NCCL}, and NVLS buffers; {_SLACK}"),
        "cdna": Family(
            "cdna",
            0.3,
            0.5,
            0.10,
            "the HIP context as rocm-smi shows it for a process that only initialised the device; RCCL's buffers as"
            f" NCCL's; {_SLACK} (the HIP caching allocator is the same code)",
        ),
    }
)


@dataclass(frozen=True)
class Size:
    """One size of a GPU type: the datasheet's GB, the GiB torch reports usable, where that figure comes from."""

    nominal_gb: int
    usable_gib: float
    source: str


_TORCH = "torch's total capacity on the card (total_memory; its out-of-memory message)"
_DERIVED = "the datasheet's size less the share the driver keeps on an H100 80GB (1.1 %); not measured on one"
_ROCM = "torch (ROCm) total_memory on one GCD: the datasheet's size, less what the driver keeps"


@dataclass(frozen=True)
class GpuType:
    """A GPU type as ``cluster.gpu_type`` names it: its family and its sizes, the most common first."""

    name: str
    family: str
    sizes: Tuple[Size, ...]


def _type(name: str, family: str, *sizes: Tuple[int, float, str]) -> GpuType:
    return GpuType(name, family, tuple(Size(*size) for size in sizes))


# cluster.gpu_type (lower case) -> its sizes. A type of several sizes is ambiguous without cluster.gpu_memory_gb.
TYPES: Mapping[str, GpuType] = MappingProxyType(
    {
        t.name: t
        for t in (
            _type("v100", "volta", (16, 15.78, _TORCH), (32, 31.74, _TORCH)),
            _type("v100s", "volta", (32, 31.74, _TORCH)),
            _type("a100", "ampere", (40, 39.39, _TORCH), (80, 79.15, _TORCH)),
            _type("l40s", "ada", (48, 44.39, "torch's total capacity on an L40S (ECC on)")),
            _type("h100", "hopper", (80, 79.10, _TORCH)),
            _type("h100_nvl", "hopper", (94, 92.9, _DERIVED)),
            _type("h200", "hopper", (141, 139.7, "torch's total capacity on an H200 SXM (141 GB HBM3e)")),
            _type("gh200", "hopper", (96, 94.5, _DERIVED), (144, 142.0, _DERIVED)),
            _type("b200", "blackwell", (180, 178.4, "nvidia-smi: 183359 MiB on an HGX B200, less 0.4 %")),
            _type("mi250x", "cdna", (64, 63.98, _ROCM)),
            _type("mi250", "cdna", (64, 63.98, _ROCM)),
            _type("mi300x", "cdna", (192, 191.98, _ROCM)),
        )
    }
)
DRIVER_SHARE = 0.075  # the most the driver keeps on the table's GPUs (an L40S with ECC on: 7.5 % of its 48 GB)
UNKNOWN_FAMILY = "hopper"  # the constants of a GPU the table does not know: the largest


@dataclass(frozen=True)
class GpuMemory:
    """The memory the check compares against: usable bytes of one GPU, its family's constants, where they come from."""

    usable_bytes: int
    family: Family
    source: str

    @property
    def usable_gib(self) -> float:
        return self.usable_bytes / GIB


class UnknownMemory(ConfigError):
    """The GPU's memory cannot be told from the config: set cluster.gpu_memory_gb."""

    def __init__(self, problem: str) -> None:
        super().__init__(
            MEMORY_KEY,
            problem,
            f"set {MEMORY_KEY}=N (one GPU's memory in GB, e.g. 80), or resources.memory_check=never to queue the job"
            " without the memory check.",
        )


def gpu_memory(gpu_type: Optional[str], memory_gb: Optional[float]) -> Optional[GpuMemory]:
    """The memory of one GPU of `gpu_type` (``cluster.gpu_type``) and `memory_gb` (``cluster.gpu_memory_gb``); None
    when neither is given. Raises UnknownMemory for a type the table does not know, or one sold in several sizes,
    without a size."""
    row = TYPES.get(str(gpu_type).lower()) if gpu_type is not None else None
    if gpu_type is not None and row is None and memory_gb is None:
        raise UnknownMemory(f"the table of GPU memory does not know cluster.gpu_type={gpu_type} (it knows {known()}).")
    if row is None:
        return None if memory_gb is None else _declared(memory_gb, FAMILIES[UNKNOWN_FAMILY], "cluster.gpu_memory_gb")
    family = FAMILIES[row.family]
    if memory_gb is None:
        if len(row.sizes) > 1:
            sold = " or ".join(f"{size.nominal_gb} GB" for size in row.sizes)
            raise UnknownMemory(f"cluster.gpu_type={gpu_type} is sold with {sold}: which one is not said.")
        memory_gb = row.sizes[0].nominal_gb
    size = next((s for s in row.sizes if s.nominal_gb == memory_gb), None)
    if size is None:
        return _declared(memory_gb, family, f"cluster.gpu_memory_gb (a size of {row.name} the table does not know)")
    return GpuMemory(int(size.usable_gib * GIB), family, f"{row.name} {size.nominal_gb} GB: {size.source}")


def _declared(memory_gb: float, family: Family, words: str) -> GpuMemory:
    usable = int(memory_gb * (1 - DRIVER_SHARE) * GIB)
    return GpuMemory(usable, family, f"{words}: {memory_gb:g} GB read as {size_text(usable)} usable")


def known() -> str:
    """The table's types with their sizes, in words: ``v100 (16, 32 GB), a100 (40, 80 GB), ...``."""
    return ", ".join(f"{t.name} ({', '.join(str(s.nominal_gb) for s in t.sizes)} GB)" for t in TYPES.values())


def device_bytes(memory: GpuMemory, peak: int, communicators: int) -> int:
    """What the device holds beyond `peak` bytes of tensors: the context, the allocator's slack, and the buffers of
    `communicators` NCCL communicators (0 for a job of one rank)."""
    family = memory.family
    return int(family.context_gib * GIB + family.slack * peak + communicators * family.communicator_gib * GIB)


def tensor_budget(memory: GpuMemory, communicators: int) -> int:
    """The most bytes of tensors that fit with what the device adds (:func:`device_bytes`): the peak at which the
    need reaches the usable memory (0 where the device's own share leaves nothing)."""
    family = memory.family
    fixed = family.context_gib * GIB + communicators * family.communicator_gib * GIB
    budget = max(0, int((memory.usable_bytes - fixed) / (1 + family.slack)))

    def fits(peak: int) -> bool:
        return peak + device_bytes(memory, peak, communicators) <= memory.usable_bytes

    while fits(budget + 1):  # the roundings of the division and of device_bytes' int(): a byte or two
        budget += 1
    while budget > 0 and not fits(budget):
        budget -= 1
    return budget


__all__ = [
    "FAMILIES",
    "GIB",
    "TYPES",
    "Family",
    "GpuMemory",
    "GpuType",
    "Size",
    "UnknownMemory",
    "device_bytes",
    "tensor_budget",
]
