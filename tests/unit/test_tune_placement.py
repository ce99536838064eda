"""controller=slurm's batch script: one task, no GPU, the profile's partition, account (its account_env too) and QoS
by the controller's time limit, the profile's setup after the job's SLURM_* variables are unset, and the same command
line with the controller here and the sweep dir pinned."""

from __future__ import annotations

import sys

import pytest
from omegaconf import OmegaConf

from hpc_train.errors import ConfigError
from hpc_train.tune.placement import TOKEN_VARIABLE, Placement
from hpc_train.tune.settings import tune_settings

PROFILE = {
    "name": "site",
    "partition": "cpu_p1",
    "account_env": "SITE_PROJECT",
    "account_suffix": "@cpu",
    "qos_by_time": [{"max_minutes": 1200, "qos": "qos_short"}, {"max_minutes": 6000, "qos": "qos_long"}],
    "setup": ["module load python"],
}


def _placement(tmp_path, time: str) -> Placement:
    node = {"scheduler": {"max_resource": 9}, "controller": "slurm", "controller_time": time}
    return Placement(tmp_path / "study", tune_settings(node))


def test_the_controller_job_asks_for_one_task_no_gpu_and_the_profile_s_partition_account_and_qos(tmp_path, monkeypatch):
    monkeypatch.setenv("SITE_PROJECT", "abc")
    monkeypatch.setattr(sys, "argv", ["hpc-train", "-m", "hydra/sweeper=adaptive", "hydra.sweeper.controller=slurm"])
    place = _placement(tmp_path, "48:00:00")
    script = place._script(OmegaConf.create({"cluster": PROFILE}), "tok", tmp_path / "study" / "controller.log")
    lines = script.splitlines()
    for option in ("--ntasks=1", "--cpus-per-task=2", "--time=2880", "--partition=cpu_p1", "--account=abc@cpu"):
        assert f"#SBATCH {option}" in lines, script
    assert "#SBATCH --qos=qos_long" in lines and "gpu" not in script, script
    unset = next(i for i, line in enumerate(lines) if line.startswith("for v in"))
    assert lines[unset + 1] == "module load python"  # the profile's setup after the job's variables are gone
    assert f"export {TOKEN_VARIABLE}=tok PYTHONUNBUFFERED=1" in lines
    study = tmp_path / "study"
    assert lines[-1].endswith(f"hydra/sweeper=adaptive hydra.sweep.dir={study} hydra.sweeper.controller=here")


def test_a_controller_time_longer_than_any_qos_is_refused_naming_the_key(tmp_path, monkeypatch):
    monkeypatch.setenv("SITE_PROJECT", "abc")
    with pytest.raises(ConfigError) as err:
        _placement(tmp_path, "200:00:00")._script(OmegaConf.create({"cluster": PROFILE}), "t", tmp_path / "log")
    assert err.value.key == "hydra.sweeper.controller_time" and "6000 minutes" in err.value.problem
