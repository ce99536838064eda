"""Any Hydra app: hpc_train's launchers pass the conformance suites Hydra runs for every launcher plugin.

The suites ship inside the installed hydra-core (``hydra.test_utils.launcher_common_tests``);
hydra-submitit-launcher runs them the same way with ``submitit_local``. Here with
``hpc_train_local`` (each job a process of its own, through submitit's local executor).
"""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
import zipfile

import pytest
from hydra.test_utils.launcher_common_tests import BatchedSweeperTestSuite, IntegrationTestSuite, LauncherTestSuite
from hydra.version import VersionBase, __compat_version__

from tests.support.paths import REPO

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
    """Hydra's suites assume a fresh process's version base: unset, which Hydra settles as its compatibility
    base 1.1 (jobs change directory). initialize_config_dir sets it for good in the process that calls it
    (test_config's tests do), so each suite test starts from 1.1, and Hydra's singletons are put back after it."""
    VersionBase.instance().setbase(__compat_version__)  # as hydra.version.base_at_least does in a fresh process


@pytest.mark.parametrize(
    "task_launcher_cfg, extra_flags",
    [
        (
            {"defaults": [{"override hydra/launcher": "hpc_train_local"}], "hydra": {"launcher": {"timeout_min": 2}}},
            ["-m"],
        )
    ],
)
class TestLocalLauncherIntegration(IntegrationTestSuite):
    pass


# -- Hydra finds the launchers by its own plugin scan ---------------------------------------------------------
SCAN = (
    "import hydra_plugins.hpc_train_launcher as p, hpc_train.conf as c, os\n"
    "from hydra.core.plugins import Plugins\nfrom hydra.plugins.launcher import Launcher\n"
    "names = sorted(k.__name__ for k in Plugins.instance().discover(Launcher) if k.__module__ == p.__name__)\n"
    "print(names, os.path.dirname(p.__file__), os.path.isfile(os.path.join(c.CONFIG_DIR, 'config.yaml')))\n"
)
LAUNCHERS = "['AppLocalLauncher', 'AppSlurmLauncher', 'HpcTrainLauncher']"


def test_hydras_plugin_scan_finds_the_launchers_in_the_editable_install(tmp_path):
    """`pip install -e .` (what the tests run from): a fresh process outside the checkout, nothing on PYTHONPATH."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run([sys.executable, "-c", SCAN], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == [*LAUNCHERS.split(), str(REPO / "hydra_plugins" / "hpc_train_launcher"), "True"]


def test_hydras_plugin_scan_finds_the_launchers_in_a_wheel_install(tmp_path):
    """The wheel `pip install .` would install, unpacked on its own: its hydra_plugins/ and its shipped YAML are found
    (python -S: the editable install's .pth is not read, so nothing comes from the checkout)."""
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--quiet",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            tmp_path / "dist",
            REPO,
        ],
        check=True,
        capture_output=True,
        cwd=tmp_path,
    )
    (wheel,) = (tmp_path / "dist").glob("hpc_train-*.whl")
    zipfile.ZipFile(wheel).extractall(tmp_path / "site")
    path = f"{tmp_path / 'site'}:{sysconfig.get_paths()['purelib']}"
    proc = subprocess.run(
        [sys.executable, "-S", "-c", SCAN], cwd=tmp_path, env={"PYTHONPATH": path}, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == [
        *LAUNCHERS.split(),
        str(tmp_path / "site" / "hydra_plugins" / "hpc_train_launcher"),
        "True",
    ]
