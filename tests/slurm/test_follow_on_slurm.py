"""One follower behind ``launcher.wait``, the Python API's ``Job.wait()`` and ``hpc-train-report --watch``, on the
Slurm test cluster: a job requeued from outside (``scontrol requeue``) is said in the same line by each, and from a
laptop a wait whose SSH control connection is killed mid-command reconnects and goes on to the job's end."""

from __future__ import annotations

import contextlib
import io
import json
import re
import subprocess
import sys
import time
from dataclasses import dataclass
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


def requeue_a_training_job(jobs: list) -> bool:
    """`scontrol requeue` the first of `jobs` with two training steps, taken off the list; whether the list is empty."""
    ready = next((job for job in jobs if train_rows(job.run_dir) >= 2), None)
    if ready is not None:
        subprocess.run(["scontrol", "requeue", ready.job_id], check=True)
        jobs.remove(ready)
    return not jobs


@dataclass
class Requeued:
    """A job of submit() followed by Job.wait() and a one-job sweep followed by --watch, both requeued by scontrol."""

    job: hpc_train.Job
    said: str  # what Job.wait() printed
    summary: dict
    swept: hpc_train.Job
    watch: subprocess.Popen
    watched: str  # what the watch printed


@pytest.fixture(scope="module")
def requeued_from_outside(slurm_cluster, tmp_path_factory) -> Requeued:
    """The two jobs run side by side (one job's time, not two): each is requeued once it has two training steps."""
    folder = tmp_path_factory.mktemp("requeued")
    with pytest.MonkeyPatch.context() as env:  # as cpu_here and the step sleep give a test (module fixtures come first)
        env.setenv("CUDA_VISIBLE_DEVICES", "")
        env.chdir(folder)
        env.setenv("HPC_TRAIN_STEP_SLEEP", "0.3")
        job = hpc_train.submit([*JOB, *SLURM, "trainer.max_steps=12"], run_dir=folder / "run")
        (swept,) = hpc_train.sweep([*JOB, *SLURM, "trainer.max_steps=12"], sweep_dir=folder / "sweep")
        command = [sys.executable, "-m", "hpc_train.report.command", str(folder / "sweep"), "--watch", "--every", "1"]
        watch = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            training = [job, swept]  # each requeued as soon as it has two training steps
            wait_for(lambda: requeue_a_training_job(training), 180, "two training steps of each job")
            with contextlib.redirect_stdout(io.StringIO()) as said:
                summary = job.wait(timeout=300)
            watched, _ = watch.communicate(timeout=300)
        finally:
            if watch.poll() is None:
                watch.kill()
    return Requeued(job, said.getvalue(), summary, swept, watch, watched)


def test_job_wait_says_a_requeue_from_outside_in_launcher_waits_words(requeued_from_outside):
    """A job requeued by scontrol while it trains: Job.wait() says so once, in launcher.wait's line, and returns the
    last attempt's summary."""
    job, said, summary = requeued_from_outside.job, requeued_from_outside.said, requeued_from_outside.summary
    assert said.count(REQUEUED.format(job=job.job_id)) == 1, said
    assert summary["global_step"] == 12 and job.state() == "COMPLETED", summary
    assert (job.run_dir / "attempts.jsonl").read_text().count('"event": "start"') == 2  # the job ran twice


def test_watch_says_a_requeue_from_outside_in_launcher_waits_words(requeued_from_outside):
    """hpc-train-report --watch on a sweep whose job is requeued by scontrol while it trains: launcher.wait's line,
    written once, and the watch ends with the job's last attempt (exit 0)."""
    job, watch, out = requeued_from_outside.swept, requeued_from_outside.watch, requeued_from_outside.watched
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
