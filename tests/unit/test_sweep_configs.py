"""A sweep job's config read from a shared composition equals Hydra's full composition of that job.

``launch/sweep_configs.py`` sets each job's plain values on one composition per set of group
choices and resolves only the interpolations that may read them. These tests compare, job by
job, what it returns with Hydra's own full composition of the same overrides (through
Hydra's real config loader): same resolved values, same run dir.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hydra.core.global_hydra import GlobalHydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode

from hpc_train.config.engine import checked_view
from hpc_train.config.errors import ConfigError
from hpc_train.launch.hydra.cli_child import hydra_initialized as _hydra
from hpc_train.launch.hydra.sweep_configs import SweepConfigs


@pytest.fixture
def sweep_configs(tmp_path):
    """A SweepConfigs over the shipped configs, as the launcher gets it from Hydra in `hpc-train -m`."""
    from hydra.core.utils import setup_globals

    setup_globals()
    before = HydraConfig.instance().cfg

    def make(common):
        loader = GlobalHydra.instance().hydra.config_loader  # type: ignore[union-attr]
        master = loader.load_configuration(
            "config", [*common, f"hydra.sweep.dir={tmp_path}"], run_mode=RunMode.MULTIRUN
        )
        return SweepConfigs(loader, master), master

    with _hydra(None):
        yield make
    HydraConfig.instance().cfg = before


def _full(configs: SweepConfigs, overrides, idx):
    config = configs.full(overrides, idx)
    HydraConfig.instance().set_config(config)
    return checked_view(config).plain(), Path(str(config.hydra.sweep.dir)) / str(config.hydra.sweep.subdir)


COMMON = ["launcher=slurm", "dry_run=true", "model=toy_mlp", "data=synthetic", "cluster.cpus_per_gpu=1"]


@pytest.mark.parametrize(
    "extra, swept",
    [
        # plain values, one of them read by an interpolation the job's config adds
        (["+tag=s${seed}-lr${trainer.lr}"], [["seed=3", "trainer.lr=0.5"], ["seed=4", "trainer.lr=0.25"]]),
        # a value that is itself an interpolation, a node read whole by another key
        (["+tag=${trainer}"], [["trainer.batch_size=${seed}", "seed=64"], ["trainer.batch_size=32", "seed=1"]]),
        # Hydra's node: job numbers and the override dir name in the run dir and in the job's config
        (
            ["hydra.sweep.subdir=${hydra.job.num}_${hydra.job.override_dirname}", "+where=${hydra:job.num}"],
            [["seed=1"], ["seed=2"]],
        ),
        # list values
        (
            [],
            [
                ["strategy=pipeline", "strategy.balance=[1,1]", "resources.gpus_per_node=2"],
                ["cluster.setup=[module purge,module load x]"],
            ],
        ),
    ],
)
def test_each_job_equals_hydras_full_composition(sweep_configs, extra, swept):
    configs, _ = sweep_configs(COMMON)
    for idx, job in enumerate(swept):
        overrides = [*COMMON, *extra, *job]
        fast = configs.resolved(overrides, idx)
        full_plain, full_dir = _full(configs, overrides, idx)
        assert fast.view.plain() == full_plain, (overrides, fast.view.plain(), full_plain)
        assert fast.run_dir == full_dir
    # the shared composition is left as it was: the first job again gives the first job's values
    overrides = [*COMMON, *extra, *swept[0]]
    assert configs.resolved(overrides, 0).view.plain() == _full(configs, overrides, 0)[0]


def test_a_value_hydra_refuses_is_worded_by_hydra(sweep_configs):
    """A key the config does not have goes through Hydra's full composition, which refuses it in its own words."""
    from hydra.errors import ConfigCompositionException

    configs, _ = sweep_configs(COMMON)
    with pytest.raises(ConfigCompositionException, match="trainer.lrr"):
        configs.resolved([*COMMON, "trainer.lrr=0.1"], 0)


def test_a_bad_value_is_refused_naming_its_key(sweep_configs):
    configs, _ = sweep_configs(COMMON)
    with pytest.raises(ConfigError) as err:
        configs.resolved([*COMMON, "trainer.lr=fast"], 0)
    assert err.value.key == "trainer.lr"
    assert configs.resolved([*COMMON, "trainer.lr=0.1"], 1).view.trainer.lr == 0.1
