"""Your own training script: `hpc-train [overrides] -- train.py ARGS`, locally and on the Slurm test cluster.

The script is tests/support/scripts/nanogpt_like/train.py: nanoGPT's shape (configurator-style `--key=value`,
data opened relative to its working directory, `ckpt.pt` and `--init_from=resume`, DDP with NCCL on
`cuda:{LOCAL_RANK}` whenever `RANK` is set), unaware of hpc_train and Slurm: it trains on the CPU only if
its one-process layout gives it no torchrun variable. tests/support/scripts/show_env.py writes the environment
it was given, read back key by key.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import List

import pytest

from tests.support.cli import assert_ok, read_summary, run_cli
from tests.support.paths import SCRIPTS
from tests.support.slurm import scontrol_job

PROJECT = SCRIPTS / "nanogpt_like"
OUT = "--out_dir=${hydra:runtime.output_dir}/out"  # each run (each sweep job) its own out dir
SCRIPT = ["--", "train.py", "--device=cpu", OUT]
SHOW_ENV = ["--", "../show_env.py"]
OBJECTIVE = "script.objective_regex='val loss ([0-9.]+)'"
RESUME = ["script.resume_args=['--init_from=resume']", "script.resume_if=${hydra:runtime.output_dir}/out/ckpt.pt"]
# What torchrun sets (less its agent's TORCHELASTIC_*): none of it reaches a one-process layout's script.
TORCHRUN_KEYS = {
    "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE", "NODE_RANK",
    "ROLE_RANK", "ROLE_NAME", "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
}
# A login shell left over from a torchrun or an interactive allocation: none of it may reach the script.
STALE_SHELL = dict(
    RANK="7", LOCAL_RANK="3", WORLD_SIZE="9", LOCAL_WORLD_SIZE="9", GROUP_RANK="5", NODE_RANK="5",
    MASTER_ADDR="nowhere", MASTER_PORT="1", TORCHELASTIC_ERROR_FILE="/nowhere/error.json", MY_OWN_SETTING="kept",
)
SLURM = ["launcher=slurm", "cluster.cpus_per_gpu=1", "cluster.time=5", "strategy=single", "resources.gpus_per_node=1"]


def hpc_train(args: List[str], run_dir: Path, **kwargs) -> subprocess.CompletedProcess:
    """hpc-train with the run dir set before `--` (everything after it is the script's)."""
    split = args.index("--") if "--" in args else len(args)
    return run_cli([*args[:split], f"hydra.run.dir={run_dir}", *args[split:]], None, cwd=PROJECT, **kwargs)


def interrupted_after_a_checkpoint(args: List[str], run_dir: Path, command) -> str:
    """Submit the script job, run `command(job)` (a requeue, a signal) once it wrote a checkpoint, wait for the
    job to complete; its Slurm id."""
    proc = hpc_train(args, run_dir)
    assert_ok(proc)
    job = re.search(r"submitted Slurm job (\d+)", proc.stdout).group(1)
    wait_for_checkpoint(job, run_dir)
    subprocess.run(command(job), check=True)
    wait_for_completion(job, run_dir)
    return job


def wait_for_checkpoint(job: str, run_dir: Path) -> None:
    """Until the script has written its first ckpt.pt (then it is worth interrupting)."""
    deadline = time.monotonic() + 180
    while not (run_dir / "out" / "ckpt.pt").exists():
        assert time.monotonic() < deadline, f"no checkpoint yet ({scontrol_job(job).get('JobState')})"
        time.sleep(0.5)


def wait_for_completion(job: str, run_dir: Path) -> None:
    """Until the (requeued) job is COMPLETED with a summary; a job that failed or was cancelled fails the test."""
    deadline = time.monotonic() + 300
    while not ((run_dir / "summary.json").exists() and scontrol_job(job).get("JobState") == "COMPLETED"):
        state = scontrol_job(job).get("JobState")
        assert state not in ("FAILED", "CANCELLED", "TIMEOUT") and time.monotonic() < deadline, state
        time.sleep(1)


def script_envs(run_dir: Path) -> List[dict]:
    """The environments tests/support/scripts/show_env.py was started with, one per process, by host and pid."""
    return [json.loads(path.read_text()) for path in sorted((run_dir / "env").glob("*.json"))]


def test_each_layout_gives_the_script_what_python_or_torchrun_would(tmp_path):
    """single, dp, model_parallel and pipeline run the script as `python script.py` runs it: no torchrun variable,
    not even one the login shell had; a one-rank ddp gets torchrun's, for rank 0 of 1."""
    shell = dict(os.environ, **STALE_SHELL)
    one_process = ["strategy=single", "strategy=dp", "strategy=model_parallel", "strategy=pipeline"]
    for index, strategy in enumerate([*one_process, "strategy=ddp"]):
        run_dir = tmp_path / str(index)
        gpus = "1" if strategy in ("strategy=single", "strategy=ddp") else "2"
        assert_ok(hpc_train([strategy, f"resources.gpus_per_node={gpus}", *SHOW_ENV], run_dir, env=shell))
        [env] = script_envs(run_dir)
        assert env["HPC_TRAIN_RUN_DIR"] == str(run_dir) and env["HPC_TRAIN_ATTEMPT"] == "1", strategy
        assert env["OMP_NUM_THREADS"] == str(os.cpu_count()) and env["MY_OWN_SETTING"] == "kept", strategy
        assert env["CUDA_VISIBLE_DEVICES"] == "", "left as it was (the tests hide GPUs)"
        assert not [key for key in env if key.startswith(("TORCHELASTIC_", "HPC_TRAIN_LOCAL", "HPC_TRAIN_LAUNCH"))]
        given = {key: env[key] for key in TORCHRUN_KEYS & set(env)}
        if strategy in one_process:
            assert given == {}, f"{strategy}: torchrun's variables reached a one-process script: {given}"
        else:
            port = given.pop("MASTER_PORT")
            assert port.isdigit() and port != STALE_SHELL["MASTER_PORT"]
            assert given == dict(
                RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1", GROUP_RANK="0", GROUP_WORLD_SIZE="1",
                NODE_RANK="0", ROLE_RANK="0", ROLE_NAME="default", ROLE_WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
            )


def test_a_nanogpt_shaped_script_with_its_ddp_switch_trains_on_the_cpu_under_single(tmp_path):
    """The script starts DDP with NCCL on cuda:LOCAL_RANK whenever RANK is set: under strategy=single it must not
    be, so --device=cpu holds, as with `python train.py --device=cpu`. Under a one-rank ddp (torchrun's variables)
    the same command fails as it fails under torchrun: the switch is live."""
    run_dir = tmp_path / "run"
    proc = hpc_train(["strategy=single", *SCRIPT, "--max_iters=3"], run_dir, env=dict(os.environ, **STALE_SHELL))
    assert_ok(proc)
    assert "iter 3: loss" in proc.stdout and read_summary(run_dir)["attempts"] == 1
    ddp = hpc_train(["strategy=ddp", "resources.gpus_per_node=1", *SCRIPT, "--max_iters=3"], tmp_path / "ddp")
    assert ddp.returncode != 0 and "iter 1: loss" not in ddp.stdout
    assert re.search(r"NCCL|CUDA|GPU", ddp.stdout + ddp.stderr), ddp.stderr[-2000:]


def test_a_nanogpt_shaped_script_runs_in_its_own_folder(tmp_path):
    run_dir = tmp_path / "run"
    proc = hpc_train(["strategy=single", OBJECTIVE, *SCRIPT, "--max_iters=12"], run_dir)
    assert_ok(proc)
    assert "config: learning_rate=0.01 max_iters=12 init_from='scratch'" in proc.stdout
    assert (run_dir / "out" / "ckpt.pt").is_file(), "the interpolated --out_dir is the run dir's"
    summary = read_summary(run_dir)
    assert summary["script"] == ["train.py", "--device=cpu", f"--out_dir={run_dir}/out", "--max_iters=12"]
    assert summary["eval_loss"] == float(re.search(r"val loss ([0-9.]+)", proc.stdout).group(1))
    spec = (run_dir / "job_config.yaml").read_text()
    assert f"cwd: {PROJECT}" in spec and f"--out_dir={run_dir}/out" in spec


def test_sweep_overrides_reach_the_script_typed_as_python_writes_them(tmp_path):
    sweep = tmp_path / "sweep"
    args = ["-m", "strategy=single", "+script.overrides.learning_rate=0.001,0.1", "+script.overrides.max_iters=3"]
    proc = run_cli([*args, f"hydra.sweep.dir={sweep}", *SCRIPT], None, cwd=PROJECT)
    assert_ok(proc)
    logs = [(sweep / job / "logs" / "rank0.log").read_text() for job in ("0", "1")]
    assert "--learning_rate=0.001 --max_iters=3" in logs[0] and "--learning_rate=0.1 --max_iters=3" in logs[1]
    for job in ("0", "1"):
        assert (sweep / job / "out" / "ckpt.pt").is_file()


@pytest.mark.slurm
def test_a_two_job_slurm_sweep_over_the_scripts_learning_rate_one_job_requeued(slurm_cluster, tmp_path):
    """strategy=single on Slurm: no torchrun variable reaches the nanoGPT-shaped script (it would start NCCL and
    fail). One job of the sweep is requeued after its first checkpoint and resumes from it."""
    sweep = tmp_path / "sweep"
    args = [
        "-m", *SLURM, "launcher.wait=true", OBJECTIVE, *RESUME, "+script.overrides.learning_rate=0.001,0.1",
        f"hydra.sweep.dir={sweep}", *SCRIPT, "--max_iters=20", "--eval_interval=5", "--step_sleep=0.3",
    ]
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
    command = [sys.executable, "-m", "hpc_train.cli", *args]
    cli = subprocess.Popen(command, cwd=PROJECT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 180
    while not (sweep / "0" / "out" / "ckpt.pt").exists() and cli.poll() is None:
        assert time.monotonic() < deadline, "the first job wrote no checkpoint"
        time.sleep(0.3)
    first = (sweep / "jobs.tsv").read_text().splitlines()[1].split("\t")
    assert first[1] == "0"
    subprocess.run(["scontrol", "requeue", first[0]], check=True)
    out, _ = cli.communicate(timeout=400)
    assert cli.returncode == 0, out
    rows = [line.split("\t") for line in (sweep / "jobs.tsv").read_text().splitlines()[1:]]
    assert len(rows) == 2
    for row in rows:
        summary = read_summary(sweep / row[1])
        assert summary["attempts"] == (2 if row[1] == "0" else 1) and summary["eval_loss"] > 0, (row, summary)
        assert (sweep / row[1] / "out" / "ckpt.pt").is_file(), "each job's ${hydra:runtime.output_dir} is its own"
    outs = [(sweep / "slurm" / f"{row[0]}_0_log.out").read_text() for row in rows]  # the array's task logs
    learning_rates = [re.search(r"config: learning_rate=([0-9.]+) max_iters=20", o).group(1) for o in outs]
    assert sorted(learning_rates) == ["0.001", "0.1"]
    resumed = int(re.search(r"resuming from iter (\d+)", outs[0]).group(1))
    assert 5 <= resumed < 20 and resumed % 5 == 0 and "iter 20: loss" in outs[0]
    assert "resuming" not in outs[1] and read_summary(sweep / "0")["script"][-1] == "--init_from=resume"


@pytest.mark.slurm
def test_a_slurm_sweep_gives_each_layout_its_environment(slurm_cluster, tmp_path):
    """dp (one task, two GPUs) and ddp (two tasks, a GPU each) as one sweep: the dp script sees Slurm's variables
    and both GPUs, no torchrun variable; each ddp rank sees torchrun's, for its rank, and the node's two GPUs.
    The login shell's stale torchrun variables reach neither."""
    sweep = tmp_path / "sweep"
    args = ["-m", *SLURM[:-2], "launcher.wait=true", "strategy=dp,ddp", "resources.gpus_per_node=2"]
    proc = run_cli([*args, f"hydra.sweep.dir={sweep}", *SHOW_ENV], None, cwd=PROJECT, timeout=600,
                   env=dict(os.environ, **STALE_SHELL))
    assert_ok(proc)
    [dp] = script_envs(sweep / "0")
    assert not TORCHRUN_KEYS & set(dp) and not [key for key in dp if key.startswith("TORCHELASTIC_")], dp
    assert dp["SLURM_NTASKS"] == "1" and len(dp["CUDA_VISIBLE_DEVICES"].split(",")) == 2, "the node's two GPUs"
    assert dp["HPC_TRAIN_RUN_DIR"] == str(sweep / "0") and dp["MY_OWN_SETTING"] == "kept"
    ddp = sorted(script_envs(sweep / "1"), key=lambda env: env["RANK"])
    assert [env["RANK"] for env in ddp] == ["0", "1"] and [env["SLURM_PROCID"] for env in ddp] == ["0", "1"]
    for env in ddp:
        assert env["LOCAL_RANK"] == env["SLURM_LOCALID"] and env["WORLD_SIZE"] == env["LOCAL_WORLD_SIZE"] == "2"
        assert env["GROUP_RANK"] == env["NODE_RANK"] == "0" and env["MASTER_ADDR"] == env["SLURMD_NODENAME"]
        assert env["MASTER_PORT"] != STALE_SHELL["MASTER_PORT"]
        assert env["CUDA_VISIBLE_DEVICES"] == ddp[0]["CUDA_VISIBLE_DEVICES"], "the node's GPUs, as under torchrun"
    assert len(ddp[0]["CUDA_VISIBLE_DEVICES"].split(",")) == 2, "each rank picks cuda:LOCAL_RANK of the job's two"


@pytest.mark.slurm
def test_scontrol_requeue_resumes_the_script_from_its_checkpoint(slurm_cluster, tmp_path):
    run_dir = tmp_path / "run"
    args = [
        *SLURM, "script.resume_args=['--init_from=resume']", "script.resume_if=${hydra:runtime.output_dir}/out/ckpt.pt",
        *SCRIPT, "--max_iters=30", "--eval_interval=5", "--step_sleep=0.3",
    ]
    job = interrupted_after_a_checkpoint(args, run_dir, lambda job: ["scontrol", "requeue", job])
    fields = scontrol_job(job)
    assert fields["Restarts"] == "1"
    summary = read_summary(run_dir)
    assert summary["attempts"] == 2 and summary["script"][-1] == "--init_from=resume"
    out = next((run_dir / "slurm").glob(f"{job}_0_log.out")).read_text()
    resumed = int(re.search(r"resuming from iter (\d+)", out).group(1))
    assert 5 <= resumed < 30 and resumed % 5 == 0
    assert "iter 30: loss" in out
    starts = [json.loads(line) for line in (run_dir / "attempts.jsonl").read_text().splitlines()]
    assert [r["attempt"] for r in starts if r["event"] == "start"] == [1, 2]


@pytest.mark.slurm
def test_the_requeue_signal_requeues_a_script_that_does_not_handle_it(slurm_cluster, tmp_path):
    """Slurm's USR2 before the time limit (sent by hand here) reaches every process of the job: the script ignores
    it (an unhandled USR2 would kill it), hpc_train requeues the job, the next attempt resumes."""
    run_dir = tmp_path / "run"
    args = [
        *SLURM, "launcher.signal_delay_s=30", "script.resume_args=['--init_from=resume']",
        *SCRIPT, "--max_iters=30", "--eval_interval=5", "--step_sleep=0.3",
    ]
    job = interrupted_after_a_checkpoint(args, run_dir, lambda job: ["scancel", "--signal=USR2", job])
    assert scontrol_job(job)["Restarts"] == "1"
    records = [json.loads(line) for line in (run_dir / "attempts.jsonl").read_text().splitlines()]
    assert [(r["attempt"], r["how"]) for r in records if r["event"] == "end"] == [(1, "timeout"), (2, "finish")]
    out = (run_dir / "slurm" / f"{job}_0_log.out").read_text()
    assert re.search(r"resuming from iter ([1-9]\d*)", out) and "iter 30: loss" in out
    assert "received SIGUSR2: stopping the script" in (run_dir / "slurm" / f"{job}_0_log.err").read_text()


def test_optuna_optimises_what_the_script_prints(tmp_path):
    sweep = tmp_path / "sweep"
    args = [
        "-m", "hydra/sweeper=optuna", "hydra.sweeper.sampler.seed=1", "hydra.sweeper.n_trials=2",
        f"hydra.sweep.dir={sweep}", "strategy=single", OBJECTIVE, "+script.overrides.max_iters=4",
        "+script.overrides.learning_rate=interval(0.001,0.1)", *SCRIPT,
    ]
    assert_ok(run_cli(args, None, cwd=PROJECT, timeout=600))
    losses = [read_summary(path.parent)["eval_loss"] for path in sorted(sweep.glob("*/summary.json"))]
    assert len(losses) == 2
    import yaml

    results = yaml.safe_load((sweep / "optimization_results.yaml").read_text())
    assert results["best_value"] == pytest.approx(min(losses), rel=1e-9)
    assert 0.001 <= results["best_params"]["+script.overrides.learning_rate"] <= 0.1
