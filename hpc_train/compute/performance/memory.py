"""A rank's peak memory, and a CUDA out-of-memory error said in words.

On a GPU: the caching allocator's peak of allocated bytes (what tensors held) and of reserved bytes (what the
allocator took from the device). On a CPU: the process's resident high-water mark (``getrusage``), which counts
everything the process ever held, torch and Python included.
"""

from __future__ import annotations

import contextlib
import resource
import sys
from typing import Dict, Iterator, Optional

import torch

from hpc_train.compute.runtime.refusal import Refusal
from hpc_train.records.performance import gib

# What lowers a rank's memory, in the order to try it.
REMEDIES = (
    "a smaller trainer.batch_size, or the same batch in more trainer.grad_accum_steps",
    "trainer.activation_checkpointing=blocks",
    "strategy=fsdp (or strategy=mesh with more shards) to shard parameters, gradients and optimizer state",
)


def peak(device: torch.device) -> Dict[str, int]:
    """{"allocated", "reserved"} on a GPU, {"resident"} on a CPU: bytes, the most since the process started."""
    if device.type == "cuda":
        return {
            "allocated": int(torch.cuda.max_memory_allocated(device)),
            "reserved": int(torch.cuda.max_memory_reserved(device)),
        }
    scale = 1 if sys.platform == "darwin" else 1024  # ru_maxrss: bytes on macOS, KiB on Linux
    return {"resident": int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * scale}


class OutOfMemory(Refusal):
    """A rank ran out of device memory: which rank, at which step, the peak so far and what lowers it."""


def out_of_memory_message(rank: int, step: int, device: torch.device, error: BaseException) -> str:
    seen = peak(device)
    total: Optional[int] = None
    if device.type == "cuda":
        with contextlib.suppress(RuntimeError):
            total = torch.cuda.get_device_properties(device).total_memory
    held = ", ".join(f"{gib(value)} {kind}" for kind, value in seen.items())
    first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    return (
        f"rank {rank} ran out of memory on {device} in step {step} (peak so far {held}"
        + (f" of {gib(total)}" if total else "")
        + f"): {first}. To fit: "
        + "; ".join(REMEDIES)
        + "."
    )


@contextlib.contextmanager
def out_of_memory_named(rank: int, step: int, device: torch.device) -> Iterator[None]:
    """A CUDA out-of-memory error inside the block becomes an :class:`OutOfMemory` saying what to change."""
    try:
        yield
    except torch.cuda.OutOfMemoryError as error:
        raise OutOfMemory(out_of_memory_message(rank, step, device, error)) from error
