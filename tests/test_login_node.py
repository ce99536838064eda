"""The launch side (config, validation, layout, submission) must not import torch."""

import subprocess
import sys

from tests.conftest import REPO

LAUNCH_MODULES = [
    "hpc_train.cli",
    "hpc_train.launch.run",
    "hpc_train.launch.plan",
    "hpc_train.launch.layout",
    "hpc_train.launch.validate",
    "hpc_train.launch.local",
    "hpc_train.launch.jobspec",
    "hpc_train.launch.slurm",
    "hpc_train.launch.sweep",
    "hpc_train.compute.job",  # pickled by the login node for submitit
    "submitit",
]


def test_launch_side_does_not_import_torch():
    code = "import sys\n" + "".join(f"import {m}\n" for m in LAUNCH_MODULES) + "heavy = [m for m in ('torch', 'torchvision', 'numpy', 'sklearn') if m in sys.modules]\nprint(heavy)\nassert not heavy, heavy\n"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert proc.returncode == 0, proc.stdout + proc.stderr


import pytest


@pytest.mark.parametrize("launcher", ["local", "slurm"])
def test_dry_run_does_not_import_torch(launcher, tmp_path):
    code = (
        "import sys\nfrom hpc_train.cli import main\n"
        f"sys.argv = ['hpc-train', 'launcher={launcher}', 'dry_run=true', 'hydra.run.dir={tmp_path}/run']\n"
        "main()\nassert 'torch' not in sys.modules, 'dry run imported torch'\nprint('OK')\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert proc.returncode == 0 and "OK" in proc.stdout, proc.stdout + proc.stderr
