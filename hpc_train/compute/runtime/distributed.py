"""Process-group setup and teardown, device binding, and the few collectives the trainer needs."""

from __future__ import annotations

import contextlib
import datetime
import os
from pathlib import Path
from typing import ContextManager, Dict, List, Optional

import torch
import torch.distributed as dist
from torch.distributed import ProcessGroup

from hpc_train.compute.runtime import heartbeat
from hpc_train.compute.runtime.ranks import RankInfo
from hpc_train.processes.rank_env import MASTER_FD_VARIABLE
from hpc_train.records import rundir
from hpc_train.records.hang import COLLECTIVE


def task_devices(info: RankInfo, gpus_per_task: int) -> List[torch.device]:
    """The devices this task owns: GPUs ``local_rank*gpus_per_task ...`` or the CPU.

    With fewer visible GPUs than asked for (a laptop with one GPU), the devices wrap around,
    so every stage still gets a device; without CUDA every stage sits on the CPU.
    """
    if not torch.cuda.is_available():
        return [torch.device("cpu")] * gpus_per_task
    count = torch.cuda.device_count()
    first = info.local_rank * gpus_per_task
    return [torch.device("cuda", (first + i) % count) for i in range(gpus_per_task)]


def nccl_environment(run_dir: Optional[Path]) -> Dict[str, str]:
    """What NCCL needs to fail instead of hanging, and to leave a trace of its last collectives when it does.

    ``TORCH_NCCL_ASYNC_ERROR_HANDLING=1``: a collective that exceeds ``trainer.dist_timeout_s`` aborts the
    communicator and ends the process (the launcher then names the rank); the flight recorder
    (``TORCH_NCCL_TRACE_BUFFER_SIZE``, ``TORCH_FR_BUFFER_SIZE`` in newer torch) keeps the last 2000
    collectives of every rank and ``TORCH_NCCL_DUMP_ON_TIMEOUT=1`` writes them on a timeout to
    ``logs/nccl_trace_rank_<r>`` in the run dir (read them with ``torch.distributed.flight_recorder``'s
    ``fr_trace``). Set only where the user has not set them; untested without GPUs.
    """
    env = {
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
        "TORCH_NCCL_TRACE_BUFFER_SIZE": "2000",
        "TORCH_FR_BUFFER_SIZE": "2000",
        "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
    }
    if run_dir is not None:
        env["TORCH_NCCL_DEBUG_INFO_TEMP_FILE"] = str(Path(run_dir) / rundir.LOGS / "nccl_trace_rank_")
    return env


def init_process_group(
    info: RankInfo, backend: str, timeout_s: float, device: torch.device, run_dir: Optional[Path] = None
) -> None:
    """Join the job's process group (no-op for a single process)."""
    if not info.is_distributed:
        return
    if backend == "auto":
        backend = "nccl" if device.type == "cuda" else "gloo"
    if backend == "nccl":
        for name, value in nccl_environment(run_dir).items():
            os.environ.setdefault(name, value)
    os.environ.setdefault("MASTER_ADDR", info.master_addr)
    os.environ.setdefault("MASTER_PORT", str(info.master_port))
    if device.type == "cuda":
        torch.cuda.set_device(device)
    timeout = datetime.timedelta(seconds=timeout_s)
    store = handed_store(info, timeout)
    dist.init_process_group(
        backend=backend,
        init_method=None if store is not None else f"tcp://{info.master_addr}:{info.master_port}",
        store=store,
        rank=info.rank,
        world_size=info.world_size,
        timeout=timeout,
    )
    global _control_group
    # Small CPU-side messages (stop requests, RNG states for checkpoints) go over gloo even when
    # the gradients go over NCCL: no GPU synchronisation, no CUDA tensors to pickle.
    _control_group = (
        dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=timeout_s)) if backend == "nccl" else None
    )


_control_group = None


def handed_store(info: RankInfo, timeout: datetime.timedelta) -> Optional[dist.Store]:
    """The rendezvous's store when the local launcher handed rank 0 its listening socket (MASTER_FD_VARIABLE): rank 0
    serves on that socket, the others connect. None: the tcp:// rendezvous, where rank 0 binds MASTER_PORT."""
    handed = os.environ.get(MASTER_FD_VARIABLE)
    if not handed:
        return None
    is_master = info.rank == 0
    return dist.TCPStore(
        info.master_addr,
        info.master_port,
        info.world_size,
        is_master,
        timeout,
        master_listen_fd=int(handed) if is_master else None,
    )


def teardown() -> None:
    global _control_group
    _control_group = None
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def is_initialized() -> bool:
    return dist.is_available() and dist.is_initialized()


def all_reduce_mean(value: torch.Tensor) -> torch.Tensor:
    """Mean over all ranks (identity without a process group)."""
    if not is_initialized():
        return value
    return all_reduce_sum(value) / dist.get_world_size()


def all_reduce_sum(value: torch.Tensor) -> torch.Tensor:
    """Sum over all ranks, on a copy (identity without a process group)."""
    if not is_initialized():
        return value
    value = value.clone()
    with heartbeat.phase(COLLECTIVE):
        dist.all_reduce(value, op=dist.ReduceOp.SUM)
    return value


def barrier() -> None:
    if is_initialized():
        with heartbeat.phase(COLLECTIVE):
            dist.barrier()


def _collective(marked: bool) -> ContextManager[object]:
    """The heartbeat's mark for a collective of the main thread; none for another thread's (a side group's)."""
    return heartbeat.phase(COLLECTIVE) if marked else contextlib.nullcontext()


def control_barrier(group: Optional[ProcessGroup] = None, marked: bool = True) -> None:
    """A barrier on the CPU control group, or on `group` (no GPU work involved)."""
    if is_initialized():
        with _collective(marked):
            dist.barrier(group=group or _control_group)


def collective_device(device: torch.device) -> torch.device:
    """NCCL reduces CUDA tensors only; gloo reduces CPU tensors."""
    if is_initialized() and dist.get_backend() == "nccl":
        return device
    return torch.device("cpu")


def all_reduce_max_int(value: int) -> int:
    """Maximum of a small integer over all ranks, on the CPU control group."""
    return all_reduce_max_ints([value])[0]


def all_reduce_max_ints(values: List[int], group: Optional[ProcessGroup] = None, marked: bool = True) -> List[int]:
    """Element-wise maximum of a few small integers over all ranks, in one collective on the CPU control group
    (or on `group`)."""
    if not is_initialized():
        return list(values)
    tensor = torch.tensor(values, dtype=torch.int64)
    with _collective(marked):
        dist.all_reduce(tensor, op=dist.ReduceOp.MAX, group=group or _control_group)
    return [int(v) for v in tensor.tolist()]


def broadcast_from_main(obj: object) -> object:
    """Rank 0's picklable `obj` on every rank, over the CPU control group."""
    if not is_initialized():
        return obj
    box = [obj]
    with heartbeat.phase(COLLECTIVE):
        dist.broadcast_object_list(box, src=0, group=_control_group)
    return box[0]


def gather_to_main(obj: object, group: Optional[ProcessGroup] = None, marked: bool = True) -> Optional[List[object]]:
    """Every rank's picklable `obj`, in rank order, on rank 0 (None elsewhere); on the CPU control group or `group`."""
    if not is_initialized():
        return [obj]
    rank = dist.get_rank()
    out: Optional[List[object]] = [None] * dist.get_world_size() if rank == 0 else None
    with _collective(marked):
        dist.gather_object(obj, out, dst=0, group=group or _control_group)
    return out


def gather_floats_to_main(values: List[float]) -> Optional[List[List[float]]]:
    """Every rank's few numbers, in rank order, on rank 0 (None elsewhere): one gather of float64 on the CPU control
    group, no pickling."""
    if not is_initialized():
        return [list(values)]
    mine = torch.tensor(values, dtype=torch.float64)
    rank = dist.get_rank()
    out = [torch.empty_like(mine) for _ in range(dist.get_world_size())] if rank == 0 else None
    with heartbeat.phase(COLLECTIVE):
        dist.gather(mine, out, dst=0, group=_control_group)
    return [tensor.tolist() for tensor in out] if out is not None else None


class SideGroup:
    """A gloo group of its own, for collectives made off the main thread (a checkpoint written in the background).

    A group runs its collectives in the order they are called, so a second thread may not share the main thread's
    groups: its calls would interleave with the training step's. Not marked in the heartbeat either: a rank's
    progress (what the hang watchdog reads) is its main thread's. Without a process group every call is local.
    """

    def __init__(self) -> None:
        self.group = dist.new_group(backend="gloo") if is_initialized() else None  # a collective: every rank makes it

    def barrier(self) -> None:
        control_barrier(self.group, marked=False)

    def any(self, flag: bool) -> bool:
        """True on every rank when any rank passed True."""
        return bool(all_reduce_max_ints([int(bool(flag))], self.group, marked=False)[0])

    def gather_to_main(self, obj: object) -> Optional[List[object]]:
        """Every rank's picklable `obj`, in rank order, on rank 0 (None elsewhere)."""
        return gather_to_main(obj, self.group, marked=False)
