"""Staging, the part of a background checkpoint that blocks the loop: a copy training cannot change."""

from __future__ import annotations

import pytest
import torch

from hpc_train.compute.checkpointing.staging import Stager


def test_a_staged_state_shares_no_memory_with_the_original_and_keeps_its_structure():
    weight, moment = torch.arange(6.0).reshape(2, 3), torch.ones(3)
    state = {
        "model": {"w": weight},
        "optim": {"state": {0: {"exp_avg": moment, "step": 3}}, "groups": [{"lr": 0.1, "params": [0]}]},
    }
    staged = Stager().stage(state)
    weight.add_(100)  # the next optimizer step, in place
    moment.mul_(0)
    state["optim"]["groups"][0]["lr"] = 0.5  # a schedule changing its own lists
    assert torch.equal(staged["model"]["w"], torch.arange(6.0).reshape(2, 3))
    assert torch.equal(staged["optim"]["state"][0]["exp_avg"], torch.ones(3))
    assert staged["optim"]["state"][0]["step"] == 3 and staged["optim"]["groups"] == [{"lr": 0.1, "params": [0]}]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_tensors_are_staged_into_pinned_buffers_reused_from_one_save_to_the_next():
    stager = Stager()
    weight = torch.randn(4, 4, device="cuda")
    first = stager.stage({"w": weight})["w"]
    assert first.device.type == "cpu" and first.is_pinned() and torch.equal(first, weight.cpu())
    weight.add_(1)
    second = stager.stage({"w": weight})["w"]
    assert second.data_ptr() == first.data_ptr() and torch.equal(second, weight.cpu())
