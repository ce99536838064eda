"""hpc-train-report (and --watch) know a sweep that will never run: refused as a whole, or a local sweep
whose launching process was killed; they say so and exit non-zero instead of showing PENDING for ever. --watch follows
a local sweep in which one job fails (the same check follows a Slurm sweep in tests/slurm/test_sweep_slurm.py)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.support.cli import TINY, run_cli, wait_for
from tests.support.paths import REPO, SCRIPTS


def report(*args: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "hpc_train.report.command", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=60, cwd=REPO)


def test_a_refused_sweep_is_reported_refused_and_the_watch_ends(tmp_path):
    sweep_dir = tmp_path / "sweep"
    proc = run_cli(["-m", *TINY, "trainer.lr=0.01,0.1,abc", f"hydra.sweep.dir={sweep_dir}"])
    assert proc.returncode == 2
    watched = report(str(sweep_dir), "--watch", "--every", "0.2")
    assert watched.returncode == 1
    assert (
        "this sweep was refused before anything ran: hpc-train: invalid configuration for `trainer.lr`"
        in watched.stdout
    )
    plain = report(str(sweep_dir), "--no-png")
    assert plain.returncode == 1 and "this sweep was refused before anything ran" in plain.stderr


def test_a_local_sweep_whose_launcher_was_killed_is_reported_abandoned(tmp_path):
    sweep_dir = tmp_path / "sweep"
    command = [
        sys.executable,
        "-m",
        "hpc_train.cli",
        "-m",
        *TINY,
        "trainer.epochs=50",
        "seed=1,2,3",
        f"hydra.sweep.dir={sweep_dir}",
    ]
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
    proc = subprocess.Popen(
        command, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )
    try:
        wait_for(lambda: (sweep_dir / "0" / "metrics.jsonl").exists(), 120, "the first job to train")
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    started = time.monotonic()
    watched = report(str(sweep_dir), "--watch", "--every", "0.2")
    assert watched.returncode == 1 and time.monotonic() - started < 30
    assert f"the process that launched this sweep (pid {proc.pid}" in watched.stdout and "is gone" in watched.stdout


def test_a_finished_sweep_is_not_taken_for_abandoned(tmp_path):
    sweep_dir = tmp_path / "sweep"
    proc = run_cli(
        ["-m", *TINY, "trainer.max_steps=2", "trainer.epochs=null", "seed=1,2", f"hydra.sweep.dir={sweep_dir}"]
    )
    assert proc.returncode == 0, proc.stderr
    watched = report(str(sweep_dir), "--watch", "--every", "0.2")
    assert watched.returncode == 0 and "gone" not in watched.stdout and "refused" not in watched.stdout


def test_a_local_app_sweep_is_reported_job_by_job_and_a_killed_job_is_failed(tmp_path):
    """hydra/launcher=hpc_train_local: jobs.tsv holds each job's process id; the report reads the states from the
    jobs' result files (a job whose process is gone without one is FAILED), --watch ends, --rerun-failed is refused."""
    sweep_dir = tmp_path / "sweep"
    app = SCRIPTS / "plain_app"
    command = [
        sys.executable,
        "my_app.py",
        "-m",
        "hydra/launcher=hpc_train_local",
        "fail=false,true",
        "sleep_s=0,300",
        f"hydra.sweep.dir={sweep_dir}",
    ]
    launcher = subprocess.Popen(command, cwd=app, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: (sweep_dir / "1" / "attempts.txt").exists(), 60, "the sleeping job to start")
        running = report(str(sweep_dir), "--json")
        rows = {r["overrides"]: r for r in json.loads(running.stdout)}
        assert rows["fail=False sleep_s=300"]["state"] == "RUNNING", rows
        os.kill(int(rows["fail=False sleep_s=300"]["job_id"]), signal.SIGKILL)
        _, err = launcher.communicate(timeout=120)
    finally:
        if launcher.poll() is None:
            launcher.kill()
    assert launcher.returncode != 0 and "4 job(s): 1 completed, 3 failed" in err, err
    done = report(str(sweep_dir))
    assert done.returncode == 1
    lines = {" ".join(line.split()[2:4]): line.split() for line in done.stdout.splitlines()[3:7]}
    assert lines["fail=False sleep_s=0"][4:] == ["COMPLETED", "1"]
    assert lines["fail=True sleep_s=0"][4:7] == ["FAILED", "error:", "RuntimeError:"]
    assert lines["fail=False sleep_s=300"][4:] == ["FAILED", "ended", "without", "a", "result", "(killed?)"]
    assert "states: 1 COMPLETED, 3 FAILED" in done.stdout
    watched = report(str(sweep_dir), "--watch", "--every", "0.2")
    assert watched.returncode == 1 and "4 jobs: 1 COMPLETED, 3 FAILED" in watched.stdout
    rerun = report(str(sweep_dir), "--rerun-failed")
    assert rerun.returncode == 2 and "is a local sweep (hydra/launcher=hpc_train_local)" in rerun.stderr


# Job 2 of 3 trains 6 steps and its rank 0 fails after 5 (HPC_TRAIN_FAIL_AT); the others stop at 4.
FAILING = ["trainer.max_steps=4,6,4", "trainer.log_every=1", "trainer.eval=false"]
FAIL_ENV = {"HPC_TRAIN_FAIL_AT": "0:5", "HPC_TRAIN_STEP_SLEEP": "0.7"}


def watch(sweep_dir: Path, timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "hpc_train.report.command", str(sweep_dir), "--watch", "--every", "1"],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=timeout,
    )


def check_watch_output(proc: subprocess.CompletedProcess, failed_job: str) -> None:
    out = proc.stdout
    assert proc.returncode == 1, out + proc.stderr  # some job failed
    final = out.strip().split("hpc-train-report --watch")[-1]
    assert "3 jobs: 2 COMPLETED, 1 FAILED" in final
    assert f"#{failed_job} " in final and "InjectedFailure" in final and "rank0.log" in final
    # while they ran: a running job's step and loss, and an ETA once one had finished
    assert re.search(r"running:.*\n\s+\d+\s+\S+\s+\d+\s+\d+\.\d{4}", out), out
    assert "ETA" in out


def test_watch_follows_a_local_sweep(tmp_path):
    sweep_dir = tmp_path / "sweep"
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", **FAIL_ENV)
    sweep = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "hpc_train.cli",
            "-m",
            *TINY,
            "strategy=single",
            *FAILING,
            f"hydra.sweep.dir={sweep_dir}",
        ],
        cwd=REPO,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 60
        while not (sweep_dir / "multirun.yaml").exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        check_watch_output(watch(sweep_dir, timeout=300), failed_job="1")
    finally:
        sweep.kill()
        sweep.wait()
