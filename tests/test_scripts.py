"""Your own training script (issue 30): `hpc-train [overrides] -- train.py ARGS`, locally and on the Slurm test cluster.

The script is tests/scripts/nanogpt_like/train.py: nanoGPT's shape (configurator-style `--key=value`,
data opened relative to its working directory, `ckpt.pt` and `--init_from=resume`), unaware of
hpc_train and Slurm.
"""

from __future__ import annotations

import json
import re
import subprocess
import time
from pathlib import Path
from typing import List

import pytest

from tests.conftest import REPO, assert_ok, read_summary, run_cli, scontrol_job

PROJECT = REPO / "tests" / "scripts" / "nanogpt_like"
OUT = "--out_dir=${hydra:runtime.output_dir}/out"  # each run (each sweep job) its own out dir
SCRIPT = ["--", "train.py", "--device=cpu", OUT]
OBJECTIVE = "script.objective_regex='val loss ([0-9.]+)'"
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
def test_a_two_job_slurm_sweep_over_the_scripts_learning_rate(slurm_cluster, tmp_path):
    sweep = tmp_path / "sweep"
    args = [
        "-m", *SLURM, "launcher.wait=true", OBJECTIVE, "+script.overrides.learning_rate=0.001,0.1",
        f"hydra.sweep.dir={sweep}", *SCRIPT, "--max_iters=3",
    ]
    assert_ok(run_cli(args, None, cwd=PROJECT, timeout=600))
    rows = [line.split("\t") for line in (sweep / "jobs.tsv").read_text().splitlines()[1:]]
    assert len(rows) == 2
    for row in rows:
        summary = read_summary(sweep / row[1])
        assert summary["attempts"] == 1 and summary["eval_loss"] > 0
        assert (sweep / row[1] / "out" / "ckpt.pt").is_file(), "each job's ${hydra:runtime.output_dir} is its own"
    outs = [(sweep / "slurm" / f"{row[0]}_0_log.out").read_text() for row in rows]  # the array's task logs
    assert {re.search(r"config: learning_rate=([0-9.]+) max_iters=3", o).group(1) for o in outs} == {"0.001", "0.1"}


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
