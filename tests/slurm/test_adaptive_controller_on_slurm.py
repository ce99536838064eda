"""hydra.sweeper.controller=slurm on the Slurm test cluster: the command queues the study's controller as a Slurm job
of its own and returns; a second controller is refused while that job runs; the job submits the trials' rungs as
Slurm jobs and ends the study (one trial of one rung: about a minute, mostly the rung's job)."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from hpc_train.jobs.study import controller_state, trial_rows
from hpc_train.records import run_claim
from tests.support.cli import TINY, assert_ok
from tests.support.paths import REPO

pytestmark = [pytest.mark.slurm]

STUDY = [
    "launcher=slurm",
    "cluster.cpus_per_gpu=1",
    "cluster.time=10",
    *TINY,
    "trainer.batch_size=32",
    "trainer.checkpoint_every=0",
    "trainer.max_steps=2",
    "hydra/sweeper=adaptive",
    "trainer.lr=choice(0.05,0.1)",
    "hydra.sweeper.sampler=grid",
    "hydra.sweeper.max_trials=1",
    "hydra.sweeper.max_concurrent=1",
    "hydra.sweeper.scheduler.name=none",
    "hydra.sweeper.poll_s=0.5",
    "hydra.sweeper.controller_time=15",
]


def _command(sweep_dir):
    return [sys.executable, "-m", "hpc_train.cli", "-m", *STUDY, f"hydra.sweep.dir={sweep_dir}"]


def _listed(job: str) -> bool:
    done = subprocess.run(["squeue", "-h", "-j", job, "-o", "%T"], capture_output=True, text=True, timeout=30)
    return bool(done.stdout.strip())


def test_a_slurm_controller_is_queued_refuses_a_second_and_ends_the_study(tmp_path):
    sweep_dir = tmp_path / "study"
    queued = subprocess.run(
        [*_command(sweep_dir), "hydra.sweeper.controller=slurm"], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert_ok(queued)
    claim = run_claim.read(sweep_dir)
    assert claim is not None and claim.slurm_job, queued.stdout
    job = claim.slurm_job
    assert f"the study's controller runs as Slurm job {job}" in queued.stdout, queued.stdout
    alive, line = controller_state(sweep_dir)
    assert alive is True and f"Slurm job {job}" in line, line
    second = subprocess.run(_command(sweep_dir), cwd=REPO, capture_output=True, text=True, timeout=120)
    assert second.returncode == 2, second.stdout + second.stderr
    assert f"already has a live controller: Slurm job {job}" in second.stdout + second.stderr
    assert f"scancel {job}" in second.stdout + second.stderr
    script = (sweep_dir / "controller.sbatch").read_text()
    assert "#SBATCH --ntasks=1" in script and "#SBATCH --time=15" in script, script
    assert "--gres" not in script and "--gpus" not in script, script  # no GPU
    deadline = time.monotonic() + 300
    while _listed(job) and time.monotonic() < deadline:
        time.sleep(1)
    log = (sweep_dir / "controller.log").read_text()
    assert "hpc-train: study done: best trial" in log, log[-3000:]
    rows = trial_rows(sweep_dir)
    assert [row["state"] for row in rows] == ["COMPLETE"], rows
    assert all(row["job_id"] and not str(row["job_id"]).startswith("local") for row in rows), rows  # Slurm rungs
    assert run_claim.read(sweep_dir) is None  # released at the study's end
