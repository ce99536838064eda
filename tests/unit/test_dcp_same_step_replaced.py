"""A sharded (DCP) checkpoint saved again for the same step replaces the old one, by either way of installing it."""

from __future__ import annotations

from pathlib import Path
from typing import Any, List

import pytest
import torch

from hpc_train.compute.checkpointing import dcp_dirs
from hpc_train.compute.checkpointing.dcp_consolidate import consolidate
from hpc_train.compute.checkpointing.dcp_load import read_loop
from hpc_train.compute.checkpointing.dcp_save import save_dcp


def _alone(obj: Any) -> List[Any]:
    """`gather` of a single process."""
    return [obj]


@pytest.mark.parametrize("exchange", [True, False], ids=["rename-exchange", "move-aside"])
def test_saving_the_same_step_again_replaces_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, exchange: bool
) -> None:
    if not exchange:  # file systems without renameat2(RENAME_EXCHANGE), NFS say
        monkeypatch.setattr(dcp_dirs, "_exchange", lambda a, b: False)
    folder = tmp_path / "checkpoints"
    for value in (1.0, 2.0):
        state = {"model": {"w": torch.full((8,), value)}}
        path = save_dcp(state, folder, 5, {"v": value}, 2, True, lambda: None, lambda failed: failed, _alone)
    assert [p.name for p in folder.iterdir()] == ["step_000000005"]
    assert torch.equal(consolidate(path)["w"], torch.full((8,), 2.0))
    assert read_loop(path) == {"v": 2.0}
