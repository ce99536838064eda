"""The plain sbatch scripts in sbatch/: same layout as `launcher=slurm`, valid bash, what submitit
writes (each really runs on the Slurm test cluster: tests/slurm/test_sbatch_scripts_on_slurm.py)."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path
from typing import Dict, List, Tuple

import pytest

from hpc_train.launch.backends.slurm.params import time_minutes
from tests.support.cli import TINY, assert_ok, run_cli, run_python
from tests.support.paths import REPO
from tests.unit.test_sbatch_script_per_strategy import SCRIPTS

# What the dry run renders for submitit's own bookkeeping (its log paths): not part of a job's shape.
SUBMITIT_ONLY = {"output", "error", "wckey"}
# A script may choose its own log file name.
SCRIPT_ONLY = {"output", "error"}


def sbatch_options(lines: List[str]) -> Dict[str, str]:
    """`#SBATCH --key=value` / `#SBATCH --flag` lines -> {key: value}; times in minutes."""
    options = {}
    for line in lines:
        match = re.match(r"^#SBATCH\s+--([\w-]+)(?:[= ](\S+))?\s*$", line)
        if match:
            key, value = match.group(1), match.group(2) or ""
            options[key] = str(time_minutes(value, "time")) if key == "time" else value
    return options


def script_args(text: str) -> List[str]:
    match = re.search(r"^HPC_TRAIN_ARGS=\((.*)\)$", text, flags=re.M)
    assert match, "the script has no HPC_TRAIN_ARGS=(...) line"
    return match.group(1).split()


@pytest.mark.parametrize("name", SCRIPTS)
def test_sbatch_layout_matches_the_dry_run(name, tmp_path):
    text = (REPO / "sbatch" / f"{name}.slurm").read_text()
    args = script_args(text)
    assert f"strategy={name}" in args
    dry = run_cli(["launcher=slurm", "dry_run=true", *args], tmp_path / "dry")
    assert_ok(dry)
    rendered = {k: v for k, v in sbatch_options(dry.stdout.splitlines()).items() if k not in SUBMITIT_ONLY}
    mine = {k: v for k, v in sbatch_options(text.splitlines()).items() if k not in SCRIPT_ONLY}
    assert mine == rendered
    for key in ("nodes", "ntasks-per-node", "gres", "cpus-per-task"):  # the layout itself is always there
        assert key in mine


def test_scripts_are_valid_bash():
    for name in SCRIPTS:
        proc = subprocess.run(["bash", "-n", str(REPO / "sbatch" / f"{name}.slurm")], capture_output=True, text=True)
        assert proc.returncode == 0, (name, proc.stderr)


# -- the dry run's script is submitit's ---------------------------------------------------------
# hpc_train renders the dry run's script itself (submitit has no public renderer); submitit still
# submits. Each case is submitted through submitit for real, against a stand-in `sbatch`, and the
# script submitit wrote must be the dry run's, byte for byte: a submitit upgrade that changes its
# script fails here.
RENDER_CASES = {
    "generic": ["launcher=slurm", "strategy=ddp", "resources.nodes=2", "resources.gpus_per_node=2"],
    "jean_zay": ["launcher=slurm", "cluster=jean_zay", "cluster.gpu_type=a100", "resources.time=30:00:00"],
    "usr1-gpus-per-node": [
        "launcher=slurm",
        "launcher.signal=USR1",
        "launcher.signal_delay_s=45",
        "cluster.gpu_flag=gpus-per-node",
        "cluster.mem_gb=64",
        "cluster.account=proj",
        "cluster.qos=short",
        "cluster.partition='gpu,gpu_big'",
        "cluster.setup=['module load \"py torch\"','export X=1']",
        "+cluster.extra={exclusive: true, mail-type: END}",
        "launcher.array_parallelism=3",
        "job_name=my.job+1",
    ],
}


def _slurm_params(overrides: List[str], run_dir: Path) -> Dict:
    from hydra import compose, initialize_config_dir

    from hpc_train.conf import CONFIG_DIR
    from hpc_train.launch.backends.slurm.params import slurm_parameters
    from hpc_train.launch.planning.plan import make_plan

    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        cfg = compose(config_name="config", overrides=["dry_run=true", *TINY, *overrides])
        return slurm_parameters(make_plan(cfg, run_dir))


def _submitted_script(overrides: List[str], tmp_path: Path, monkeypatch) -> Tuple[Dict, Path, str]:
    """The job's slurm parameters, its submitit folder and the script submitit wrote (a stand-in sbatch took it)."""
    from hpc_train.launch.backends.slurm.submit import make_executor

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, body in (("sbatch", 'echo "Submitted batch job 4242"'), ("srun", "exit 1")):
        (bin_dir / name).write_text(f"#!/bin/sh\n{body}\n")
        (bin_dir / name).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    monkeypatch.setenv("IDRPROJ", "proj")
    params = _slurm_params(overrides, tmp_path / "run")
    folder = tmp_path / "run" / "slurm"
    handle = make_executor(folder, params, 3).submit(print, "never runs")
    assert handle.job_id == "4242"
    return params, folder, (folder / "4242_submission.sh").read_text()


@pytest.mark.parametrize("case", list(RENDER_CASES))
def test_dry_run_script_is_what_submitit_writes(case, tmp_path, monkeypatch):
    from hpc_train.launch.backends.slurm.script import render_sbatch

    monkeypatch.delenv("SUBMITIT_PREEMPT_SIGNAL", raising=False)
    params, folder, written = _submitted_script(RENDER_CASES[case], tmp_path, monkeypatch)
    assert render_sbatch(folder, params) == written
    assert "#SBATCH --requeue" in written.splitlines()
    if case == "usr1-gpus-per-node":
        assert "#SBATCH --signal=B:USR1@45" in written.splitlines() and "export SUBMITIT_PREEMPT_SIGNAL=USR1" in written


def test_a_preempt_signal_left_in_the_login_shell_does_not_change_the_jobs_signal(tmp_path, monkeypatch):
    """SUBMITIT_PREEMPT_SIGNAL=USR1 exported on the login node (another project's habit), launcher.signal USR2 (the
    default): Slurm is still asked for USR2 and submitit's handler in the job listens to USR2, as the trainer does."""
    from hpc_train.launch.backends.slurm.script import render_sbatch

    monkeypatch.setenv("SUBMITIT_PREEMPT_SIGNAL", "USR1")
    params, folder, written = _submitted_script(["launcher=slurm", "launcher.signal_delay_s=60"], tmp_path, monkeypatch)
    lines = written.splitlines()
    assert "#SBATCH --signal=B:USR2@60" in lines and not any("USR1" in line for line in lines)
    assert "export SUBMITIT_PREEMPT_SIGNAL=USR2" in lines
    assert render_sbatch(folder, params) == written


# -- on the Slurm test cluster -----------------------------------------------------------------


def test_sbatch_launcher_does_not_import_torch(tmp_path):
    code = (
        "import sys\nfrom hpc_train.cli import main\n"
        f"sys.argv = ['hpc-train', 'launcher=sbatch', 'hydra.run.dir={tmp_path}/run']\n"
        "try:\n    main()\nexcept SystemExit as stop:\n    assert not stop.code, stop.code\n"
        "assert 'torch' not in sys.modules, 'launcher=sbatch imported torch'\nprint('OK')\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    proc = run_python(code, env=env)
    assert proc.returncode == 0 and "OK" in proc.stdout, proc.stdout + proc.stderr
    assert (tmp_path / "run" / "job_config.yaml").exists()
    assert "not inside a Slurm allocation" in proc.stderr
