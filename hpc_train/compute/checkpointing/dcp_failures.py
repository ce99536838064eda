"""Reads what went wrong in a DCP collective, because DCP hands every rank one ``CheckpointException`` holding
pickled copies of each failing rank's error: the first failing rank, our own error among them (a full disk among
them: hpc_train.compute.checkpointing.files.is_disk_full).
"""

from __future__ import annotations

from typing import Optional

from torch.distributed.checkpoint.api import CheckpointException

from hpc_train.compute.checkpointing.files import CheckpointError


def describe(err: BaseException) -> str:
    """One line for an error, naming the first failing rank of a CheckpointException."""
    if isinstance(err, CheckpointException) and err.failures:
        rank, (first, _) = next(iter(sorted(err.failures.items(), key=lambda item: item[0])))
        return f"rank {rank}: {type(first).__name__}: {first}"
    return f"{type(err).__name__}: {err}"


def own_error(err: BaseException) -> Optional[CheckpointError]:
    """The first CheckpointError (ours: a refusal, a torn file) among the failures DCP collected from all ranks."""
    if isinstance(err, CheckpointError):
        return err
    if isinstance(err, CheckpointException):
        for _, (failure, _) in sorted(err.failures.items(), key=lambda item: item[0]):
            if isinstance(failure, CheckpointError):
                return failure
    return None
