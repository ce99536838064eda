"""A full disk at any point of a checkpoint's write is one error, DiskFull, for both formats: the temporary file or
dir removed, the previous checkpoint kept and loadable. Where a real full disk cannot make a write fail (a tmpfs fills
on a write, never on an fsync or a rename), the failure is injected at that point (HPC_TRAIN_DISK_FULL_AT), in this
process; a real full disk is tests/e2e/test_disk_full.py."""

from __future__ import annotations

import errno
from pathlib import Path
from typing import Any, List

import pytest
import torch

from hpc_train.compute.checkpointing.dcp_consolidate import consolidate
from hpc_train.compute.checkpointing.dcp_dirs import list_dcp_checkpoints
from hpc_train.compute.checkpointing.dcp_save import save_dcp
from hpc_train.compute.checkpointing.files import (
    DiskFull,
    is_disk_full,
    read_checkpoint,
    save_atomic,
    write_checkpoint,
)
from hpc_train.compute.runtime.refusal import Refusal
from hpc_train.records import rundir

MESSAGE = ("no space left for checkpoint", "The previous checkpoint is kept", "trainer.keep_checkpoints")


def _payload(value: float) -> dict:
    """Bigger than a file's write buffer (8 KiB), so torch.save's own writes reach the file."""
    return {"fingerprint": {"v": 1}, "state": {"w": torch.full((16_384,), value)}}


@pytest.mark.parametrize("point", ["write", "header", "fsync", "rename"])
def test_a_checkpoint_file_that_hits_a_full_disk_is_disk_full_and_keeps_the_previous_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, point: str
) -> None:
    first, second = tmp_path / "step_000000010.ckpt", tmp_path / "step_000000020.ckpt"
    write_checkpoint(_payload(1.0), first, keep=2)
    monkeypatch.setenv("HPC_TRAIN_DISK_FULL_AT", f"{point}:20")
    with pytest.raises(DiskFull) as raised:
        write_checkpoint(_payload(2.0), second, keep=2)
    message = str(raised.value)
    assert all(words in message for words in MESSAGE) and "step_000000020.ckpt" in message, message
    assert isinstance(raised.value, Refusal), "a refusal: one message and exit code 2, no traceback"
    assert sorted(p.name for p in tmp_path.iterdir()) == [first.name], "no temporary file, the previous one kept"
    assert torch.equal(read_checkpoint(first)["state"]["w"], torch.full((16_384,), 1.0))


def test_torch_saves_wrapped_enospc_is_a_full_disk() -> None:
    """torch.save's zip writer, failing to write its end after the OSError, raises a RuntimeError whose context is the
    OSError; DCP hands every rank a CheckpointException whose failures hold each rank's error."""
    from torch.distributed.checkpoint.api import CheckpointException

    try:
        try:
            raise OSError(errno.ENOSPC, "No space left on device")
        except OSError:
            # torch's own error carries the OSError as its context, not its cause
            raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 46370304 vs 46370192")  # noqa: B904
    except RuntimeError as wrapped:
        assert is_disk_full(wrapped)
        assert is_disk_full(CheckpointException("save failed", {1: (wrapped, None)}))
    assert is_disk_full(OSError(errno.EDQUOT, "Disk quota exceeded"))
    assert not is_disk_full(RuntimeError("unexpected pos")) and not is_disk_full(OSError(errno.EIO, "I/O error"))


def _alone(obj: Any) -> List[Any]:
    """`gather` of a single process."""
    return [obj]


@pytest.mark.parametrize("point", ["manifest", "install"])
def test_a_sharded_checkpoint_that_hits_a_full_disk_is_disk_full_and_keeps_the_previous_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, point: str
) -> None:
    folder = tmp_path / "checkpoints"

    def save(step: int, value: float) -> Path:
        state = {"model": {"w": torch.full((64,), value)}}
        return save_dcp(state, folder, step, {"v": value}, 2, True, lambda: None, lambda failed: failed, _alone)

    first = save(10, 1.0)
    monkeypatch.setenv("HPC_TRAIN_DISK_FULL_AT", f"{point}:20")
    with pytest.raises(DiskFull) as raised:
        save(20, 2.0)
    assert all(words in str(raised.value) for words in MESSAGE), raised.value
    assert [p.name for p in list_dcp_checkpoints(folder)] == [first.name]
    assert rundir.remove_stale_temporaries(folder) == [], "the temporary dir is removed"
    assert torch.equal(consolidate(first)["w"], torch.full((64,), 1.0))


def test_the_final_weights_on_a_full_disk_are_one_message(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The final weights (and an export) go through save_atomic: a full disk there is DiskFull too, nothing left."""

    def full(fd: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr("os.fsync", full)
    with pytest.raises(DiskFull, match=r"no space left for the final weights model\.pt in .*Fix: free space"):
        save_atomic({"w": torch.zeros(4)}, tmp_path / "model.pt", "the final weights model.pt")
    assert list(tmp_path.iterdir()) == []
