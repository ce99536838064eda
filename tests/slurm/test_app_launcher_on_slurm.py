"""Any Hydra app on the Slurm test cluster: hpc_train_slurm passes the conformance suites Hydra runs for every launcher
plugin (the same suites as tests/e2e/test_app_launcher.py runs with hpc_train_local)."""

from __future__ import annotations

import pytest
from hydra.test_utils.launcher_common_tests import BatchedSweeperTestSuite, IntegrationTestSuite, LauncherTestSuite

from tests.e2e.test_app_launcher import fresh_hydra_version_base  # noqa: F401  (an autouse fixture)

# As in Hydra's own CI: every warning is an error, except Hydra's notice that it will stop changing directory.
pytestmark = [
    pytest.mark.filterwarnings("error"),
    pytest.mark.filterwarnings("ignore:Future Hydra versions will no longer change working directory:UserWarning"),
]


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
