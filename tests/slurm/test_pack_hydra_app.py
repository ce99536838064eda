"""Packed sweeps of any Hydra app on the Slurm test cluster: an app of the user's own, written here, swept with
``hydra/launcher=hpc_train_slurm hydra.launcher.pack.allocations=2``: its 6 jobs run as job steps of exactly 2
Slurm jobs, each job's return value reaches the sweeper (Optuna's, which optimises on them), a job that raises comes
back failed, a dry run prints the allocations and their runs, and a job larger than an allocation is refused before
anything is queued. Jobs that ask for no GPU run beside one that does, or in an allocation that asks for none, whichever
flag asks for the GPUs; a job step Slurm refuses is reported in Slurm's words, with the file that holds them."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import cloudpickle
import pytest
import yaml

from hpc_train.pack import app_step

pytestmark = pytest.mark.slurm

APP = '''\
"""A Hydra app of the user's own: a value computed from its overrides, and what Slurm gave it."""

import json
import os

import hydra
from hydra.core.hydra_config import HydraConfig


@hydra.main(version_base=None, config_path=".", config_name="config")
def main(cfg) -> float:
    value = cfg.x * 10 + cfg.y
    seen = {key: os.environ.get(key) for key in ("SLURM_JOB_ID", "SLURM_STEP_ID", "CUDA_VISIBLE_DEVICES")}
    seen["hydra_job_id"] = HydraConfig.get().job.id
    with open(os.path.join(HydraConfig.get().runtime.output_dir, "seen.json"), "w") as handle:
        json.dump(seen, handle)
    if HydraConfig.get().job.num == cfg.fail_job:
        raise RuntimeError(f"my_app will not compute {value}")
    return value


if __name__ == "__main__":
    main()
'''
CONFIG = "x: 1\ny: 1\ngpus: 1\nfail_job: null\n"
PACKED = [
    "hydra/launcher=hpc_train_slurm",
    "hydra.launcher.cpus_per_task=1",
    "hydra.launcher.timeout_min=5",
    "hydra.launcher.gpus_per_node=${gpus}",
    "hydra.launcher.pack.allocations=2",
    "hydra.launcher.pack.gpus_per_node=2",
]
OPTUNA_GRID = [
    "hydra/sweeper=optuna",
    "hydra/sweeper/sampler=grid",
    "hydra.sweeper.direction=maximize",
    "hydra.sweeper.n_trials=6",
    "hydra.sweeper.n_jobs=6",  # one batch: the 6 trials in one launch
    "hydra.sweeper.max_failure_rate=0.5",
    "x=choice(1,2,3)",
    "y=choice(1,2)",
]


@pytest.fixture
def app(tmp_path: Path) -> Path:
    folder = tmp_path / "app"
    folder.mkdir()
    (folder / "my_app.py").write_text(APP)
    (folder / "config.yaml").write_text(CONFIG)
    return folder


def sweep(app: Path, args, sweep_dir: Path) -> subprocess.CompletedProcess:
    """`python my_app.py -m ARGS` as its user runs it, from the app's folder."""
    command = [sys.executable, "my_app.py", "-m", *args, f"hydra.sweep.dir={sweep_dir}"]
    return subprocess.run(command, cwd=app, capture_output=True, text=True, timeout=240)


def job_table(sweep_dir: Path):
    lines = (sweep_dir / "jobs.tsv").read_text().splitlines()
    return [dict(zip(lines[0].split("\t"), line.split("\t"))) for line in lines[1:]]


def slurm_jobs_run_from(folder: Path, since: str, count: int) -> dict:
    """Job id -> final state of every Slurm job submitted from `folder` since `since`, once accounting has `count`
    of them ended (it lags a job's end by a moment)."""
    deadline = time.monotonic() + 60
    while True:
        out = subprocess.run(
            ["sacct", "-X", "-n", "-P", "-S", since, "-o", "JobID,State,WorkDir"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        jobs = {}
        for line in out.splitlines():
            job_id, state, workdir = line.split("|")
            if workdir == str(folder):
                jobs[job_id] = state.split()[0]
        ended = [state for state in jobs.values() if state in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT")]
        if len(ended) >= count or time.monotonic() > deadline:
            return jobs
        time.sleep(0.5)


def test_six_jobs_run_in_two_slurm_jobs_and_their_values_reach_the_sweeper(slurm_cluster, app, tmp_path):
    sweep_dir = tmp_path / "sweep"
    since = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(time.time() - 1))
    # The job that fails is the first one asked, so it is told first. Optuna's grid sampler stops the study when its
    # last grid point is told, and the Optuna sweeper tolerates that stop only for a completed trial: a failure told
    # last ends the sweep with "Study.stop is supposed to be invoked inside an objective function". The grid's order
    # is random, so a failure chosen by value would be told last one run in six.
    proc = sweep(app, [*PACKED, *OPTUNA_GRID, "fail_job=0"], sweep_dir)
    assert proc.returncode == 0, proc.stderr
    assert "6 job(s): 5 completed, 1 failed" in proc.stderr
    rows = job_table(sweep_dir)
    assert sorted(row["overrides"] for row in rows) == sorted(
        f"x={x} y={y} fail_job=0" for x in (1, 2, 3) for y in (1, 2)
    )
    values = {
        row["job"]: {key: int(value) for key, value in (item.split("=") for item in row["overrides"].split())}
        for row in rows
    }
    failed = values["0"]["x"] * 10 + values["0"]["y"]
    assert f"Failed experiment: my_app will not compute {failed}" in proc.stdout + proc.stderr  # Optuna got it
    # Optuna chose from the values the jobs returned: the largest of the five that completed
    best = max((v for job, v in values.items() if job != "0"), key=lambda v: v["x"] * 10 + v["y"])
    assert yaml.safe_load((sweep_dir / "optimization_results.yaml").read_text()) == {
        "name": "optuna",
        "best_params": {"x": best["x"], "y": best["y"]},
        "best_value": float(best["x"] * 10 + best["y"]),
    }
    allocations = {row["job_id"].split(":")[0] for row in rows}
    assert len(allocations) == 2
    failing = None
    for row in rows:  # each job ran as a step of its allocation, and handed back its own value
        allocation, _, job = row["job_id"].partition(":")
        assert job == row["job"]
        seen = json.loads((sweep_dir / row["job"] / "seen.json").read_text())
        assert seen["SLURM_JOB_ID"] == allocation and seen["hydra_job_id"] == row["job_id"]
        assert seen["SLURM_STEP_ID"] is not None
        value = values[row["job"]]["x"] * 10 + values[row["job"]]["y"]
        ret = cloudpickle.loads((app_step.run_folder(sweep_dir, row["job"]) / app_step.RETURN_FILE).read_bytes())
        if row["job"] == "0":
            failing = allocation
            assert ret.status.name == "FAILED" and f"my_app will not compute {failed}" in str(ret._return_value)
        else:
            assert ret.status.name == "COMPLETED" and ret.return_value == value
    # exactly these 2 Slurm jobs ran from the app's folder; the one with the failed job says FAILED
    states = slurm_jobs_run_from(app, since, 2)
    assert states == {job_id: ("FAILED" if job_id == failing else "COMPLETED") for job_id in allocations}
    assert not (sweep_dir / ".submitit").exists()  # no submitit job at all


def test_a_dry_run_prints_the_allocations_and_their_runs_and_queues_nothing(slurm_cluster, app, tmp_path):
    sweep_dir = tmp_path / "sweep"
    proc = sweep(app, [*PACKED, "hydra.launcher.dry_run=true", "x=1,2,3", "y=1,2"], sweep_dir)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "# allocation 0: 1 node(s) x 2 GPUs, 5 min; 3 runs (#0, #2, #4)" in out
    assert "# allocation 1: 1 node(s) x 2 GPUs, 5 min; 3 runs (#1, #3, #5)" in out
    assert "#SBATCH --job-name=my_app-pack1" in out and "-m hpc_train.pack.scheduler" in out
    assert "#5 x=3 y=2: 1 node(s) x 1 task(s), gpus_per_node 1, cpus_per_task 1" in out
    assert not (sweep_dir / "jobs.tsv").exists() and not (sweep_dir / ".hpc_train" / "pack").exists()


def test_a_job_larger_than_an_allocation_is_refused_before_anything_is_queued(slurm_cluster, app, tmp_path):
    sweep_dir = tmp_path / "sweep"
    proc = sweep(app, [*PACKED, "gpus=1,4"], sweep_dir)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert (
        "invalid configuration for `hydra.launcher.pack.gpus_per_node`: sweep job #1 (gpus=4) needs 4 GPUs per node,"
        " more than each allocation's 2. Nothing was queued. Fix: set hydra.launcher.pack.gpus_per_node=4 or more, or"
        " give that run fewer GPUs (hydra.launcher.gpus_per_node)."
    ) in proc.stderr
    assert not (sweep_dir / "jobs.tsv").exists() and not (sweep_dir / ".hpc_train" / "pack").exists()


@pytest.mark.parametrize("gpus", ["hydra.launcher.gpus_per_node=${gpus}", "hydra.launcher.gres=gpu:${gpus}"])
def test_jobs_without_gpus_run_beside_a_gpu_job_and_in_an_allocation_without_gpus(slurm_cluster, app, tmp_path, gpus):
    sweep_dir = tmp_path / "sweep"
    # #0 (1 GPU) and #2 share allocation 0, which asks for 2 GPUs; #1 and #3, no GPU, share allocation 1
    args = [*(arg for arg in PACKED if "gpus_per_node=${gpus}" not in arg), gpus, "gpus=1,0,0,0"]
    proc = sweep(app, [*args, "hydra.launcher.wait=true"], sweep_dir)
    assert proc.returncode == 0 and "4 job(s): 4 completed, 0 failed" in proc.stderr, proc.stderr
    flag = "--gres=gpu:2" if "gres" in gpus else "--gpus-per-node=2"
    scripts = [(sweep_dir / ".hpc_train" / "pack" / f"allocation_{k}.sh").read_text() for k in (0, 1)]
    assert f"#SBATCH {flag}\n" in scripts[0]
    assert "--gres" not in scripts[1] and "--gpus" not in scripts[1]  # none of its runs needs a GPU: it asks for none
    visible = {job: json.loads((sweep_dir / job / "seen.json").read_text())["CUDA_VISIBLE_DEVICES"] for job in "0123"}
    assert len(visible["0"]) == 1 and all(not visible[job] for job in "123"), visible  # the jobs without: no GPU


def test_a_job_step_slurm_refuses_is_reported_in_slurms_words_with_the_file_that_holds_them(
    slurm_cluster, app, tmp_path
):
    sweep_dir = tmp_path / "sweep"
    # an srun default the allocation cannot meet (its nodes have one thread per core): Slurm refuses every step
    refused = ["hydra.launcher.setup=['export SLURM_THREADS_PER_CORE=4']", "gpus=0", "x=5"]
    proc = sweep(app, [*PACKED, *refused], sweep_dir)
    assert proc.returncode != 0 and "1 job(s): 0 completed, 1 failed" in proc.stderr, proc.stderr
    allocation = job_table(sweep_dir)[0]["job_id"].split(":")[0]
    log = app_step.run_folder(sweep_dir, "0") / "slurm" / f"{allocation}_srun.err"
    said = f"srun: error: Unable to create step for job {allocation}: Cannot request more threads per core than"
    assert said in log.read_text()
    assert (
        f"packed run {allocation}:0 ended FAILED (exit code 1) without a result: Slurm refused its job step: {said}"
        in (proc.stderr)
    )
    assert f"(in {log})" in proc.stderr
    report = subprocess.run(
        [sys.executable, "-m", "hpc_train.report.command", str(sweep_dir), "--no-png"], capture_output=True, text=True
    )
    assert said in report.stdout and str(log) in report.stdout, report.stdout
