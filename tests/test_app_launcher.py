"""Any Hydra app: hpc_train's launchers pass the conformance suites Hydra runs for every launcher plugin (issue 32).

The suites ship inside the installed hydra-core (``hydra.test_utils.launcher_common_tests``);
hydra-submitit-launcher runs them the same way with ``submitit_local``. Here with
``hpc_train_local`` (each job a process of its own, through submitit's local executor).
"""

from __future__ import annotations

import pytest
from hydra.test_utils.launcher_common_tests import (
    BatchedSweeperTestSuite,
    IntegrationTestSuite,
    LauncherTestSuite,
)

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


@pytest.mark.parametrize(
    "task_launcher_cfg, extra_flags",
    [({"defaults": [{"override hydra/launcher": "hpc_train_local"}], "hydra": {"launcher": {"timeout_min": 2}}}, ["-m"])],
)
class TestLocalLauncherIntegration(IntegrationTestSuite):
    pass
