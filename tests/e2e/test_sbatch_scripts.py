"""The plain sbatch scripts in sbatch/: same layout as `launcher=slurm`, and each really runs on the Slurm test cluster."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List, Tuple

import pytest

from hpc_train.launch.slurm import time_minutes
from tests.support.cli import TINY, assert_ok, read_summary, run_cli, run_python
from tests.support.paths import REPO
from tests.support.slurm import scontrol_job, wait_for_job_end
from tests.unit.test_sbatch_script_per_strategy import SCRIPTS

# What the dry run renders for submitit's own bookkeeping (its log paths): not part of a job's shape.
SUBMITIT_ONLY = {"output", "error", "wckey"}
# A script may choose its own log file name.
SCRIPT_ONLY = {"output", "error"}
# strategy -> (nodes, tasks per node) of the script as shipped
SHAPES = {"single": (1, 1), "dp": (1, 1), "ddp": (2, 4), "model_parallel": (1, 1), "pipeline": (1, 1), "hybrid": (2, 2)}
TRAIN = [*TINY, "trainer.max_steps=6", "trainer.epochs=null", "trainer.batch_size=32", "cluster.cpus_per_gpu=1"]


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
        "launcher=slurm", "launcher.signal=USR1", "launcher.signal_delay_s=45", "cluster.gpu_flag=gpus-per-node",
        "cluster.mem_gb=64", "cluster.account=proj", "cluster.qos=short", "cluster.partition='gpu,gpu_big'",
        "cluster.setup=['module load \"py torch\"','export X=1']", "+cluster.extra={exclusive: true, mail-type: END}",
        "launcher.array_parallelism=3", "job_name=my.job+1",
    ],
}


def _slurm_params(overrides: List[str], run_dir: Path) -> Dict:
    from hydra import compose, initialize_config_dir

    from hpc_train.conf import CONFIG_DIR
    from hpc_train.launch.plan import make_plan
    from hpc_train.launch.slurm import slurm_parameters

    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        cfg = compose(config_name="config", overrides=["dry_run=true", *TINY, *overrides])
        return slurm_parameters(make_plan(cfg, run_dir))


def _submitted_script(overrides: List[str], tmp_path: Path, monkeypatch) -> Tuple[Dict, Path, str]:
    """The job's slurm parameters, its submitit folder and the script submitit wrote (a stand-in sbatch took it)."""
    from hpc_train.launch.slurm import make_executor

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
    from hpc_train.launch.slurm import render_sbatch

    monkeypatch.delenv("SUBMITIT_PREEMPT_SIGNAL", raising=False)
    params, folder, written = _submitted_script(RENDER_CASES[case], tmp_path, monkeypatch)
    assert render_sbatch(folder, params) == written
    assert "#SBATCH --requeue" in written.splitlines()
    if case == "usr1-gpus-per-node":
        assert "#SBATCH --signal=USR1@45" in written.splitlines() and "export SUBMITIT_PREEMPT_SIGNAL=USR1" in written


def test_a_preempt_signal_left_in_the_login_shell_does_not_change_the_jobs_signal(tmp_path, monkeypatch):
    """SUBMITIT_PREEMPT_SIGNAL=USR1 exported on the login node (another project's habit), launcher.signal USR2 (the
    default): Slurm is still asked for USR2 and submitit's handler in the job listens to USR2, as the trainer does."""
    from hpc_train.launch.slurm import render_sbatch

    monkeypatch.setenv("SUBMITIT_PREEMPT_SIGNAL", "USR1")
    params, folder, written = _submitted_script(["launcher=slurm", "launcher.signal_delay_s=60"], tmp_path, monkeypatch)
    lines = written.splitlines()
    assert "#SBATCH --signal=USR2@60" in lines and not any("USR1" in line for line in lines)
    assert "export SUBMITIT_PREEMPT_SIGNAL=USR2" in lines
    assert render_sbatch(folder, params) == written


# -- on the Slurm test cluster -----------------------------------------------------------------
def submit(script: str, workdir: Path, run_dir: Path, args: List[str], sbatch_args: List[str] = (), **extra_env: str) -> str:
    """`sbatch [options] sbatch/<script>.slurm ARGS` as a user would, with the CPU test overrides."""
    env = dict(os.environ, PYTHON=sys.executable, RUN_DIR=str(run_dir), **extra_env)
    command = ["sbatch", "--parsable", "--cpus-per-task=1", "--time=10", f"--chdir={workdir}", *sbatch_args, str(REPO / "sbatch" / f"{script}.slurm"), *args]
    proc = subprocess.run(command, capture_output=True, text=True, env=env, cwd=workdir, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip().split(";")[0]


@pytest.fixture(scope="module")
def submitted(slurm_cluster, tmp_path_factory):
    """Every script submitted at once (the cluster runs what fits, queues the rest); waits for all."""
    root = tmp_path_factory.mktemp("sbatch")
    jobs = {name: submit(name, root, root / name, TRAIN) for name in SCRIPTS}
    ended = {name: wait_for_job_end(job_id, timeout=500) for name, job_id in jobs.items()}
    return root, jobs, ended


@pytest.mark.slurm
@pytest.mark.parametrize("name", SCRIPTS)
def test_script_runs_on_slurm(name, submitted):
    root, jobs, ended = submitted
    run_dir, job_id = root / name, jobs[name]
    log = root / f"hpc-train-{job_id}.out"
    assert ended[name]["JobState"] == "COMPLETED", (ended[name].get("JobState"), log.read_text() if log.exists() else "no log")
    nodes, tasks_per_node = SHAPES[name]
    world = nodes * tasks_per_node
    assert int(ended[name]["NumNodes"]) == nodes and int(ended[name]["NumTasks"]) == world
    summary = read_summary(run_dir)
    assert summary["strategy"] == name and summary["world_size"] == world and summary["global_step"] == 6
    # Every rank found its identity in srun's variables (no torchrun) and ran on the expected hosts.
    found = []
    for rank_log in sorted((run_dir / "logs").glob("rank*.log")):
        match = re.search(r"rank (\d+)/(\d+) \(local (\d+), started by ([^)]+)\) on host (\S+),", rank_log.read_text())
        found.append((int(match.group(1)), int(match.group(2)), match.group(4), match.group(5)))
    assert sorted(r[0] for r in found) == list(range(world))
    assert all(r[1] == world and r[2] == "srun" for r in found)
    assert len({r[3] for r in found}) == nodes
    assert "job spec" in log.read_text()  # the batch step wrote the spec before srun


@pytest.mark.slurm
def test_allocation_that_does_not_match_is_refused(slurm_cluster, tmp_path):
    """`sbatch --nodes=1 ddp.slurm` without resources.nodes=1: the batch step stops with the fix, no rank starts."""
    run_dir = tmp_path / "run"
    job_id = submit("ddp", tmp_path, run_dir, TRAIN, ["--nodes=1"])
    fields = wait_for_job_end(job_id, timeout=120)
    assert fields["JobState"] == "FAILED"
    log = (tmp_path / f"hpc-train-{job_id}.out").read_text()
    assert "invalid configuration for `resources.nodes`" in log and "the allocation has 1 node(s), but the overrides plan 2" in log and "Fix:" in log
    assert "Traceback" not in log
    assert not (run_dir / "job_config.yaml").exists() and not (run_dir / "logs").exists()


@pytest.mark.slurm
def test_requeue_signal_resumes_a_plain_sbatch_job(slurm_cluster, tmp_path):
    """USR2 (what `#SBATCH --signal=USR2@120` sends before the time limit): checkpoint, requeue, resume in RUN_DIR."""
    run_dir = tmp_path / "run"
    args = [*TRAIN, "trainer.max_steps=30", "trainer.log_every=2", "trainer.checkpoint_every=0"]
    job_id = submit("hybrid", tmp_path, run_dir, args, HPC_TRAIN_STEP_SLEEP="0.3")
    deadline = time.monotonic() + 180
    metrics = run_dir / "metrics.jsonl"
    while not (metrics.exists() and '"step": 4' in metrics.read_text()):
        assert time.monotonic() < deadline, "training did not start"
        assert scontrol_job(job_id).get("JobState") in ("PENDING", "CONFIGURING", "RUNNING"), scontrol_job(job_id)
        time.sleep(0.3)
    subprocess.run(["scancel", "--signal=USR2", job_id], check=True)
    fields = wait_for_job_end(job_id, timeout=300)
    log = (tmp_path / f"hpc-train-{job_id}.out").read_text()
    assert fields["JobState"] == "COMPLETED", log
    assert int(fields.get("Restarts", "0")) == 1
    assert "received SIGUSR2" in log and "job requeued" in log
    summary = read_summary(run_dir)
    assert summary["global_step"] == 30 and summary["attempts"] == 2
    assert 4 <= summary["resumed_from_step"] < 30
    steps = [int(m) for m in re.findall(r'"kind": "train", "step": (\d+)', metrics.read_text())]
    assert steps == list(range(2, 31, 2))  # one line per logged step, none lost or doubled across the requeue


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
