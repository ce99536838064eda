"""What the memory estimate (hpc_train.compute.fit) cannot estimate is refused in one message naming the module: an
operation whose result depends on the data's values cannot run on fake tensors. And what it can, it breaks down by
what holds the memory, the parts adding up to the peak (here toy_mlp with AdamW, in one process)."""

from __future__ import annotations

from pathlib import Path
from typing import List

import pytest
import torch
import torch.nn as nn
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from hpc_train.compute.fit.estimate import EstimateSettings, estimate_job
from hpc_train.compute.runtime.refusal import Refusal
from hpc_train.conf import CONFIG_DIR
from hpc_train.launch.planning.jobspec import build_job_spec
from hpc_train.launch.planning.plan import make_plan


class Gate(nn.Module):
    """Passes its input on only where the batch's sum is positive: a branch on a tensor's value."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x if x.sum() > 0 else -x


class Gated(nn.Module):
    """toy_mlp with a Gate between its layers (it takes toy_mlp's arguments)."""

    def __init__(self, image_size: int, num_classes: int, hidden: int = 16, **_: object) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Flatten(), nn.Linear(3 * image_size * image_size, hidden), Gate())
        self.head = nn.Linear(hidden, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x))


def settings(overrides: List[str], run_dir: Path) -> EstimateSettings:
    base = ["strategy=single", "model=toy_mlp", "data=synthetic", "data.image_size=8", "trainer.optimizer=adamw"]
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        cfg = compose(config_name="config", overrides=[*base, *overrides])
    return EstimateSettings.from_job_spec(OmegaConf.create(build_job_spec(make_plan(cfg, run_dir), choices={})))


def test_a_branch_on_a_tensors_value_is_refused_naming_its_module(tmp_path):
    gated = settings([f"model._target_={__name__}.Gated"], tmp_path)
    with pytest.raises(Refusal, match=r"cannot trace module 'body\.2'.*depends on the data's values"):
        estimate_job(gated)


def test_the_parts_add_up_to_the_peak_and_hold_adamws_two_states(tmp_path):
    estimate = estimate_job(settings([], tmp_path))
    (rank,) = estimate.ranks
    assert rank.peak == sum(rank._parts().values())
    # toy_mlp: 3*8*8 -> 64 -> 10, fp32. The peak is in AdamW's step: its two tensors per parameter, and what the
    # step makes while it runs (filed with them), with every gradient still held.
    params = (3 * 8 * 8 * 64 + 64 + 64 * 10 + 10) * 4
    assert rank.parameters == params and rank.gradients == params
    assert rank.optimizer_state >= 2 * params
    assert rank.stage is None and "rank 0: peak" in estimate.describe()


def test_a_strategy_the_estimate_does_not_simulate_is_refused_naming_the_ones_it_does(tmp_path):
    dp = settings(["strategy=dp", "resources.gpus_per_node=2"], tmp_path)
    with pytest.raises(Refusal, match=r"does not simulate strategy=dp yet; it simulates single, fsdp, mesh, ddp"):
        estimate_job(dp)
