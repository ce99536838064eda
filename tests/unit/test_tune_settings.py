"""The adaptive sweeper's keys (hpc_train/tune/settings.py): their defaults, and each refusal naming its full key and
the fix."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from hpc_train.errors import ConfigError
from hpc_train.tune.settings import SchedulerSettings, TuneConf, TuneSettings, tune_settings


def test_the_defaults():
    assert tune_settings({"scheduler": {"max_resource": 81}}) == TuneSettings(
        direction="minimize",
        objective=None,
        max_trials=16,
        max_concurrent=4,
        max_failures=3,
        seed=None,
        sampler="tpe",
        scheduler=SchedulerSettings("asha", "trainer.max_steps", 1, 81, 3),
        poll_s=2.0,
        params={},
    )


def test_the_plugins_config_node_reads_as_the_defaults():
    # the Hydra plugin stores TuneConf as the sweeper's node: read back, it gives the same settings
    node = OmegaConf.structured(TuneConf)
    node.scheduler.max_resource = 81
    assert tune_settings(node) == tune_settings({"scheduler": {"max_resource": 81}})


def test_set_keys_are_read_and_typed():
    node = {
        "direction": "maximize",
        "objective": "val_acc",
        "max_trials": "8",
        "max_concurrent": 2,
        "max_failures": 0,
        "seed": "7",
        "sampler": "random",
        "poll_s": "0.5",
        "params": {"trainer.lr": "interval(0.1,1)"},
        "scheduler": {"name": "hyperband", "resource_key": "trainer.epochs", "min_resource": 2, "max_resource": "20"},
    }
    assert tune_settings(node) == TuneSettings(
        direction="maximize",
        objective="val_acc",
        max_trials=8,
        max_concurrent=2,
        max_failures=0,
        seed=7,
        sampler="random",
        scheduler=SchedulerSettings("hyperband", "trainer.epochs", 2, 20, 3),
        poll_s=0.5,
        params={"trainer.lr": "interval(0.1,1)"},
    )


def test_scheduler_none_needs_no_budget():
    settings = tune_settings({"scheduler": {"name": "none", "resource_key": None}})
    assert settings.scheduler == SchedulerSettings("none", None, 1, None, 3)


S = "hydra.sweeper.scheduler"


@pytest.mark.parametrize(
    "node, key, fix",
    [
        ({"scheduler": {"name": "bohb", "max_resource": 9}}, f"{S}.name", "pick one of none, asha, hyperband"),
        ({"scheduler": {"resource_key": None, "max_resource": 9}}, f"{S}.resource_key", f"set {S}.resource_key"),
        ({"scheduler": {"resource_key": "", "max_resource": 9}}, f"{S}.resource_key", f"set {S}.resource_key"),
        ({"scheduler": {"name": "hyperband"}}, f"{S}.max_resource", f"set {S}.max_resource"),
        ({"scheduler": {"min_resource": 10, "max_resource": 9}}, f"{S}.min_resource", f"lower {S}.min_resource"),
        ({"scheduler": {"min_resource": 0, "max_resource": 9}}, f"{S}.min_resource", f"lower {S}.min_resource"),
        ({"scheduler": {"max_resource": 9, "eta": 1}}, f"{S}.eta", f"set {S}.eta=3"),
        ({"direction": "max"}, "hydra.sweeper.direction", "minimize or maximize"),
        ({"max_trials": 0}, "hydra.sweeper.max_trials", "set max_trials >= 1"),
        ({"max_concurrent": 0}, "hydra.sweeper.max_concurrent", "set max_concurrent >= 1"),
        ({"max_failures": -1}, "hydra.sweeper.max_failures", "set max_failures >= 0"),
        ({"poll_s": 0}, "hydra.sweeper.poll_s", "set poll_s to seconds > 0"),
        ({"poll_s": -1.5}, "hydra.sweeper.poll_s", "set poll_s to seconds > 0"),
        ({"controller": "tmux"}, "hydra.sweeper.controller", "pick one of here, detached, slurm"),
        ({"controller_time": "soon"}, "hydra.sweeper.controller_time", "use minutes or HH:MM:SS"),
        ({"controller_time": 0}, "hydra.sweeper.controller_time", "use minutes or HH:MM:SS"),
    ],
)
def test_each_refusal_names_its_key_and_the_fix(node, key, fix):
    node = {"scheduler": {"max_resource": 9}, **node}
    with pytest.raises(ConfigError) as err:
        tune_settings(node)
    assert err.value.key == key
    assert fix in err.value.fix
    assert f"`{key}`" in str(err.value) and f"Fix: {err.value.fix}" in str(err.value)
