"""The launch side (config, validation, layout, submission) must not import torch."""

import subprocess
import sys

import pytest

from tests.support.cli import run_python
from tests.support.paths import REPO

LAUNCH_MODULES = [
    "hpc_train",  # the public Python API, loaded from the package root on first use
    "hpc_train.api",
    "hpc_train.cli",
    "hpc_train.launch.backends.run",
    "hpc_train.launch.planning.plan",
    "hpc_train.launch.planning.layout",
    "hpc_train.launch.planning.validate",
    "hpc_train.launch.backends.local.processes",
    "hpc_train.launch.planning.jobspec",
    "hpc_train.launch.backends.slurm.submit",
    "hpc_train.launch.planning.capacity",
    "hpc_train.launch.hydra.sweep",
    "hpc_train.launch.hydra.sweep_configs",
    "hpc_train.launch.planning.sweep_limits",
    "hpc_train.launch.planning.parallelism",
    "hpc_train.config",  # the declarations, which the ranks read too
    "hpc_train.config.engine",
    "hpc_train.config.view",
    "hpc_train.launch.hydra.cli_child",
    "hpc_train.jobs.job_states",
    "hpc_train.report.command",
    "hpc_train.report.watch",
    "hpc_train.records.rank_errors",
    "hpc_train.contracts.logger_table",
    "hpc_train.processes.script_command",  # a script job's command, rendered by the dry run too
    "hpc_train.records.metrics_log",  # hpc_train.log_metrics, for a user's script
    "hpc_train.compute.entry.job",  # pickled by the login node for submitit
    "submitit",
]


def test_launch_side_does_not_import_torch():
    code = (
        "import sys\n"
        + "".join(f"import {m}\n" for m in LAUNCH_MODULES)
        + "heavy = [m for m in ('torch', 'torchvision', 'numpy', 'sklearn', 'tensorboard', 'wandb', 'mlflow') if m in "
        "sys.modules]\nprint(heavy)\nassert not heavy, heavy\n"
    )
    proc = run_python(code)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_the_config_package_stands_below_both_sides():
    """hpc_train.config is read by the login side and by every rank: none of its modules imports either side, torch
    or Hydra, and only its engine (which the package's top does not load) imports OmegaConf."""
    code = (
        "import importlib, pkgutil, sys\nimport hpc_train.config as config\n"
        "for m in pkgutil.iter_modules(config.__path__):\n"
        "    if m.name != 'engine':\n        importlib.import_module('hpc_train.config.' + m.name)\n"
        "below = lambda: [m for m in sys.modules if m.split('.')[0] in ('torch', 'hydra')"
        " or m.startswith(('hpc_train.launch', 'hpc_train.compute'))]\n"
        "assert not below() and 'omegaconf' not in sys.modules, (below(), 'omegaconf' in sys.modules)\n"
        "import hpc_train.config.engine\nassert not below(), below()\nprint('OK')\n"
    )
    proc = run_python(code)
    assert proc.returncode == 0 and "OK" in proc.stdout, proc.stdout + proc.stderr


def test_a_rank_imports_torchvision_and_dcp_only_for_jobs_that_use_them():
    """Each rank process pays its imports at every start: torchvision (ResNets, digits) and
    torch.distributed.checkpoint (sharded checkpoints) cost about 1 s together, so the compute
    side imports them only when a job needs them."""
    code = (
        "import sys\nimport hpc_train.compute.worker, hpc_train.compute.training.trainer, hpc_train.compute.parallel\n"
        "from hpc_train.compute.parallel.partitioning import flatten_layers\nimport torch\n"
        "assert len(flatten_layers(torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.ReLU()))) == 2\n"
        "heavy = [m for m in ('torchvision', 'torch.distributed.checkpoint') if m in sys.modules]\nassert not heavy, "
        "heavy\n"
        "import torchvision\nassert len(flatten_layers(torchvision.models.resnet18())) == 15\nprint('OK')\n"
    )
    proc = run_python(code)
    assert proc.returncode == 0 and "OK" in proc.stdout, proc.stdout + proc.stderr


def test_api_compose_does_not_import_torch():
    code = (
        "import sys\nimport hpc_train\ncfg = hpc_train.compose(['launcher=slurm', 'strategy=pipeline'])\nassert "
        "'torch' not in sys.modules, 'compose imported torch'\nprint('OK')\n"
    )
    proc = run_python(code)
    assert proc.returncode == 0 and "OK" in proc.stdout, proc.stdout + proc.stderr


def test_the_command_does_not_load_the_python_api_but_the_package_root_still_exports_it():
    """`hpc-train` imports hpc_train's submodules; the API module (threads, signals, subprocess
    plumbing for jobs run from Python) is loaded only when one of its names is used."""
    code = (
        "import sys\nimport hpc_train.cli\nassert 'hpc_train.api' not in sys.modules, 'the CLI loaded hpc_train.api'\n"
        "from hpc_train import Job, compose\nimport hpc_train.api\nassert compose is hpc_train.api.compose and "
        "hpc_train.run is hpc_train.api.run\n"
        "try:\n    hpc_train.not_a_name\nexcept AttributeError as err:\n    print('OK', err)\n"
    )
    proc = run_python(code)
    assert proc.returncode == 0 and "OK module 'hpc_train' has no attribute 'not_a_name'" in proc.stdout, (
        proc.stdout + proc.stderr
    )


def test_the_python_api_leaves_the_callers_garbage_collector_alone():
    """Only the `hpc-train` process tunes the GC (hpc_train/cli.py); a notebook using the API keeps its own."""
    code = (
        "import gc, sys\nbefore = gc.get_threshold()\nimport hpc_train\nhpc_train.compose(['launcher=slurm'])\n"
        "assert 'hpc_train.cli' not in sys.modules, 'the API imported the CLI module'\n"
        "assert gc.get_threshold() == before, (before, gc.get_threshold())\nprint('OK')\n"
    )
    proc = run_python(code)
    assert proc.returncode == 0 and "OK" in proc.stdout, proc.stdout + proc.stderr


def test_importing_the_command_or_composing_leaves_hydras_version_base_to_the_caller():
    """Hydra's version base is one per process and decides whether a Hydra app's jobs change directory: a
    process that imports hpc_train.cli or composes through the API (a user's Hydra app, a notebook) keeps its own."""
    code = (
        "from hydra.version import VersionBase, _UNSPECIFIED_\nimport hpc_train.cli\n"
        "assert VersionBase.instance().getbase() is _UNSPECIFIED_, ('import', VersionBase.instance().getbase())\n"
        "import hpc_train\nhpc_train.compose(['launcher=slurm'])\n"
        "assert VersionBase.instance().getbase() is _UNSPECIFIED_, ('compose', "
        "VersionBase.instance().getbase())\nprint('OK')\n"
    )
    proc = run_python(code)
    assert proc.returncode == 0 and "OK" in proc.stdout, proc.stdout + proc.stderr


@pytest.mark.parametrize("launcher", ["local", "slurm"])
def test_dry_run_does_not_import_torch(launcher, tmp_path):
    code = (
        "import sys\nfrom hpc_train.cli import main\n"
        f"sys.argv = ['hpc-train', 'launcher={launcher}', 'dry_run=true', 'hydra.run.dir={tmp_path}/run']\n"
        "main()\nassert 'torch' not in sys.modules, 'dry run imported torch'\nprint('OK')\n"
    )
    proc = run_python(code)
    assert proc.returncode == 0 and "OK" in proc.stdout, proc.stdout + proc.stderr


def run_without_slurm(args, tmp_path) -> subprocess.CompletedProcess:
    """`hpc-train ARGS` with only this Python's bin dir on PATH: no sbatch, srun or sinfo, as on a laptop."""
    from pathlib import Path

    env = {"PATH": str(Path(sys.executable).parent), "CUDA_VISIBLE_DEVICES": "", "HOME": str(tmp_path)}
    return subprocess.run(
        [sys.executable, "-m", "hpc_train.cli", *args, f"hydra.run.dir={tmp_path}/run"],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=env,
    )


def test_slurm_dry_run_renders_the_script_without_slurm_installed(tmp_path):
    proc = run_without_slurm(["launcher=slurm", "resources.nodes=2", "dry_run=true"], tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "#SBATCH --nodes=2" in proc.stdout and "#SBATCH --ntasks-per-node=4" in proc.stdout
    assert "srun" in proc.stdout  # the script still launches its tasks with srun on the cluster


def test_slurm_submission_without_slurm_commands_is_refused_clearly(tmp_path):
    proc = run_without_slurm(["launcher=slurm"], tmp_path)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert (
        "`launcher`" in proc.stderr
        and "`sbatch` and `srun` are not on PATH" in proc.stderr
        and "dry_run=true" in proc.stderr
    )
    assert "Traceback" not in proc.stdout + proc.stderr
    assert not (tmp_path / "run" / "job_config.yaml").exists()


def test_capacity_check_is_skipped_without_slurm(tmp_path):
    """Without sinfo nothing is known about the nodes: the dry run renders any size, as before."""
    proc = run_without_slurm(
        [
            "launcher=slurm",
            "resources.gpus_per_node=64",
            "cluster.cpus_per_gpu=64",
            "trainer.batch_size=64",
            "dry_run=true",
        ],
        tmp_path,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "#SBATCH --gres=gpu:64" in proc.stdout and "#SBATCH --cpus-per-task=64" in proc.stdout
