"""One follower behind ``launcher.wait``, the Python API's ``Job.wait()`` and ``hpc-train-report --watch``, on the
Slurm test cluster: a job requeued from outside (``scontrol requeue``) is said in the same line by each, and from a
laptop a wait whose SSH control connection is killed mid-command reconnects and goes on to the job's end."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

import hpc_train
from tests.e2e.test_api import SLURM
from tests.slurm.test_from_laptop import PROFILE, TINY, laptop  # noqa: F401  (laptop: the fixture)
from tests.support.cli import wait_for
from tests.support.ssh_server import as_laptop_popen
from tests.unit.test_api_without_a_job import JOB, cpu_here  # noqa: F401  (cpu_here: an autouse fixture)

pytestmark = pytest.mark.slurm

REQUEUED = "hpc-train: job {job} was requeued by Slurm (attempt 2); following it to the end of its last attempt"


def train_rows(run_dir: Path) -> int:
    path = run_dir / "metrics.jsonl"
    return path.read_text().count('"kind": "train"') if path.exists() else 0


def test_job_wait_says_a_requeue_from_outside_in_launcher_waits_words(slurm_cluster, tmp_path, capsys, monkeypatch):
    """A job requeued by scontrol while it trains: Job.wait() says so once, in launcher.wait's line, and returns the
    last attempt's summary; launcher.wait on the same run dir follows a second launch of it to its end too."""
    monkeypatch.setenv("HPC_TRAIN_STEP_SLEEP", "0.3")
    run_dir = tmp_path / "run"
    job = hpc_train.submit([*JOB, *SLURM, "trainer.max_steps=12"], run_dir=run_dir)
    wait_for(lambda: train_rows(run_dir) >= 2, 180, "two training steps")
    subprocess.run(["scontrol", "requeue", job.job_id], check=True)
    summary = job.wait(timeout=300)
    said = capsys.readouterr().out
    assert said.count(REQUEUED.format(job=job.job_id)) == 1, said
    assert summary["global_step"] == 12 and job.state() == "COMPLETED", summary
    assert (run_dir / "attempts.jsonl").read_text().count('"event": "start"') == 2  # the job ran twice


def test_watch_says_a_requeue_from_outside_in_launcher_waits_words(slurm_cluster, tmp_path, monkeypatch):
    """hpc-train-report --watch on a sweep whose job is requeued by scontrol while it trains: launcher.wait's line,
    written once, and the watch ends with the job's last attempt (exit 0)."""
    monkeypatch.setenv("HPC_TRAIN_STEP_SLEEP", "0.3")
    sweep_dir = tmp_path / "sweep"
    (job,) = hpc_train.sweep([*JOB, *SLURM, "trainer.max_steps=12"], sweep_dir=sweep_dir)
    command = [sys.executable, "-m", "hpc_train.report.command", str(sweep_dir), "--watch", "--every", "1"]
    watch = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        wait_for(lambda: train_rows(job.run_dir) >= 2, 180, "two training steps")
        subprocess.run(["scontrol", "requeue", job.job_id], check=True)
        out, _ = watch.communicate(timeout=300)
    finally:
        if watch.poll() is None:
            watch.kill()
    assert out.count(REQUEUED.format(job=job.job_id)) == 1, out
    assert watch.returncode == 0 and "1 job: 1 COMPLETED" in out.split("hpc-train-report --watch")[-1], out
    assert (job.run_dir / "attempts.jsonl").read_text().count('"event": "start"') == 2  # the job ran twice


PYTHON_API_WAIT = """
import json, sys, hpc_train
job = hpc_train.submit({overrides!r}, config_dir="conf", run_dir="outputs/cut-wait")
print("waiting", job.job_id, flush=True)
summary = job.wait(timeout=400)
print(json.dumps({{"id": job.job_id, "state": job.state(), "step": summary["global_step"]}}), flush=True)
"""


def test_job_wait_from_the_laptop_reconnects_when_the_control_connection_is_killed(laptop):  # noqa: F811
    """Every command on the cluster sleeps a second first (cluster.setup), so the wait has one in flight when the
    laptop's control master is killed: the wait says the connection dropped, reconnects, and returns the summary."""
    env = laptop["env"]
    user = env["HPC_TRAIN_SSH_LAPTOP_USER"]
    overrides = [
        *TINY, "launcher=slurm", f"cluster={PROFILE}", "strategy=single", "trainer.max_steps=30",
        "cluster.setup=['sleep 1','export HPC_TRAIN_STEP_SLEEP=0.5']",  # the job's ranks get the variable too
    ]  # fmt: skip
    script = PYTHON_API_WAIT.format(overrides=overrides)
    proc = as_laptop_popen([env["HPC_TRAIN_SSH_LAPTOP_PYTHON"], "-c", script], cwd=laptop["project"])
    try:
        assert proc.stdout is not None
        said = [proc.stdout.readline()]
        while not said[-1].startswith("waiting") and proc.poll() is None and said[-1]:
            said.append(proc.stdout.readline())
        assert said[-1].startswith("waiting"), "".join(said)
        time.sleep(3)
        in_flight = ["pgrep", "-u", user, "-f", "ControlMaster=no"]  # a wait's command running on the master
        wait_for(lambda: subprocess.run(in_flight, capture_output=True).returncode == 0, 60, "a command in flight")
        subprocess.run(["pkill", "-KILL", "-u", user, "-f", "ssh .*-M -N -f"], check=True)
        out, _ = proc.communicate(timeout=400)
    finally:
        if proc.poll() is None:
            proc.kill()
    out = "".join(said) + out
    assert proc.returncode == 0, out
    assert re.search(r"hpc-train: the connection to \S+ dropped .*; reconnecting", out), out
    assert re.search(r"hpc-train: reconnected to \S+", out), out
    result = json.loads(out.strip().splitlines()[-1])
    assert result["state"] == "COMPLETED" and result["step"] == 30, out
