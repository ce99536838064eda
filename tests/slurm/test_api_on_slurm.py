"""The public Python API (hpc_train.submit/wait/run/sweep, Job) on the Slurm test cluster."""

from __future__ import annotations

import time

import pytest

import hpc_train
from tests.e2e.test_api import SLURM
from tests.unit.test_api_without_a_job import JOB, cpu_here  # noqa: F401  (cpu_here: an autouse fixture)


@pytest.mark.slurm
def test_slurm_submit_wait_and_run(slurm_cluster, tmp_path):
    start = time.monotonic()
    job = hpc_train.submit([*JOB, *SLURM], run_dir=tmp_path / "submitted")
    assert job.launcher == "slurm" and job.job_id.isdigit() and time.monotonic() - start < 60
    assert job.state() in ("PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "COMPLETED")
    summary = job.wait(timeout=300)
    assert summary["global_step"] == 4 and job.state() == "COMPLETED"
    assert hpc_train.run([*JOB, *SLURM], run_dir=tmp_path / "run", quiet=True)["train_loss"] == summary["train_loss"]


@pytest.mark.slurm
def test_slurm_sweep(slurm_cluster, tmp_path):
    jobs = hpc_train.sweep([*JOB, *SLURM, "seed=0,1"], sweep_dir=tmp_path / "sweep")
    rows = [line.split("\t") for line in (tmp_path / "sweep" / "jobs.tsv").read_text().splitlines()[1:]]
    assert [job.job_id for job in jobs] == [row[0] for row in rows] and len(jobs) == 2
    assert [job.overrides[-1] for job in jobs] == ["seed=0", "seed=1"]
    assert [job.run_dir for job in jobs] == [tmp_path / "sweep" / "0", tmp_path / "sweep" / "1"]
    assert [job.wait(timeout=300)["global_step"] for job in jobs] == [4, 4]
    assert [job.state() for job in jobs] == ["COMPLETED", "COMPLETED"]
