"""Any Hydra app: hpc_train's launchers pass the conformance suites Hydra runs for every launcher plugin (issue 32).

The suites ship inside the installed hydra-core (``hydra.test_utils.launcher_common_tests``);
hydra-submitit-launcher runs them the same way with ``submitit_local``. Here with
``hpc_train_local`` (each job a process of its own, through submitit's local executor).
"""

from __future__ import annotations

import os

import pytest
from hydra.test_utils.launcher_common_tests import (
    BatchedSweeperTestSuite,
    IntegrationTestSuite,
    LauncherTestSuite,
)
from hydra.version import VersionBase

from hydra_plugins.hpc_train_launcher import register
from tests.conftest import REPO

register()  # the in-process suites: the classes, whatever Hydra's scan found

# As in Hydra's own CI: every warning is an error, except Hydra's notice that it will stop changing directory.
pytestmark = [
    pytest.mark.filterwarnings("error"),
    pytest.mark.filterwarnings("ignore:Future Hydra versions will no longer change working directory:UserWarning"),
]

LOCAL = ("hpc_train_local", ["hydra.launcher.timeout_min=2"])


@pytest.mark.parametrize("launcher_name, overrides", [LOCAL])
class TestLocalLauncher(LauncherTestSuite):
    pass


@pytest.mark.parametrize("launcher_name, overrides", [(LOCAL[0], [*LOCAL[1], "hydra.sweeper.max_batch_size=2"])])
class TestLocalLauncherBatched(BatchedSweeperTestSuite):
    pass


@pytest.fixture(autouse=True)
def fresh_hydra_version_base(hydra_restore_singletons):
    """Hydra's suites assume a fresh process's version base (unset: jobs change directory). Hydra's
    initialize_config_dir sets it for good in the process that calls it (test_config's tests do), so each suite
    test gets a fresh one, and Hydra's singletons are put back after it."""
    VersionBase.set_instance(VersionBase())


@pytest.fixture(autouse=True)
def plugin_on_the_path(monkeypatch):
    """The apps the integration suite starts find hydra_plugins/ through Hydra's scan: in the editable install the
    tests run from, only with the checkout on PYTHONPATH (see hydra_plugins/hpc_train_launcher)."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))


@pytest.mark.parametrize(
    "task_launcher_cfg, extra_flags",
    [({"defaults": [{"override hydra/launcher": "hpc_train_local"}], "hydra": {"launcher": {"timeout_min": 2}}}, ["-m"])],
)
class TestLocalLauncherIntegration(IntegrationTestSuite):
    pass


# -- the same suites on the Slurm test cluster --------------------------------------------------------------
SLURM = ("hpc_train_slurm", ["hydra.launcher.timeout_min=5", "hydra.launcher.cpus_per_task=1"])


@pytest.fixture
def on_slurm(slurm_cluster):
    """The Slurm test cluster runs, and SLURM_CONF points at it (tests.conftest.slurm_cluster)."""


@pytest.mark.slurm
@pytest.mark.usefixtures("on_slurm")
@pytest.mark.parametrize("launcher_name, overrides", [SLURM])
class TestSlurmLauncher(LauncherTestSuite):
    pass


@pytest.mark.slurm
@pytest.mark.usefixtures("on_slurm")
@pytest.mark.parametrize("launcher_name, overrides", [(SLURM[0], [*SLURM[1], "hydra.sweeper.max_batch_size=2"])])
class TestSlurmLauncherBatched(BatchedSweeperTestSuite):
    pass


@pytest.mark.slurm
@pytest.mark.usefixtures("on_slurm")
@pytest.mark.parametrize(
    "task_launcher_cfg, extra_flags",
    [
        (
            {
                "defaults": [{"override hydra/launcher": "hpc_train_slurm"}],
                "hydra": {"launcher": {"timeout_min": 5, "cpus_per_task": 1}},
            },
            ["-m"],
        )
    ],
)
class TestSlurmLauncherIntegration(IntegrationTestSuite):
    pass
