"""A 3,000-job sweep through Slurm's default MaxArraySize (1001): three arrays, throttled, every job completed.

Marked ``scale`` (deselected by default; ``bash scripts/test.sh -m scale``): it runs 3,000
Slurm tasks. The jobs are laid out and submitted by the launcher's own code (validation, job
specs, ``slurm.submit_jobs`` cutting arrays, ``launcher.array_parallelism=16``) and counted by
``hpc-train-report`` from sacct; each task runs ``tests/support/sweep_probe.Probe`` instead of training
(see there why).
"""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from hpc_train import compose
from hpc_train.jobs import job_table
from hpc_train.launch.backends.slurm import submit as slurm
from hpc_train.launch.planning.jobspec import build_job_spec
from hpc_train.launch.planning.plan import make_plan
from tests.support.cli import TINY
from tests.support.paths import REPO
from tests.support.sweep_probe import Probe

JOBS = 3000
DEADLINE_S = 3600  # for every job to complete: ~10 minutes on 2 idle cores, far more on a loaded machine

# The suite's per-test limit (600 s, pyproject.toml) is shorter than this test's own work: its limit is its deadline.
pytestmark = [pytest.mark.scale, pytest.mark.slurm, pytest.mark.timeout(DEADLINE_S + 300)]


def test_a_3000_job_sweep_goes_in_as_three_throttled_arrays_and_all_complete(slurm_cluster_16, tmp_path, monkeypatch):
    monkeypatch.chdir(REPO)  # the tasks import tests.support.sweep_probe from where they start
    sweep_dir = tmp_path / "sweep"
    cfg = compose(
        [
            "launcher=slurm",
            "cluster.cpus_per_gpu=1",
            "cluster.time=10",
            "model=toy_mlp",
            *TINY,
            "strategy=single",
            "launcher.array_parallelism=16",
        ]
    )
    jobs = []
    for n in range(JOBS):
        plan = make_plan(cfg, sweep_dir / str(n))
        jobs.append(slurm.prepare(plan, build_job_spec(plan, {}), f"seed={n}"))
    submitted = slurm.submit_jobs(jobs, log_root=sweep_dir, task=Probe)
    ids = [str(handle.job_id) for _, handle in submitted]
    job_table.print_and_append(
        sweep_dir,
        [
            job_table.JobRow(i, job.plan.run_dir.name, job.label, job.plan.layout.describe())
            for i, (job, _) in zip(ids, submitted)
        ],
    )
    arrays = sorted({i.split("_")[0] for i in ids}, key=int)
    try:
        assert len(arrays) == 3 and len(set(ids)) == JOBS
        deadline = time.monotonic() + DEADLINE_S
        while time.monotonic() < deadline:
            report = subprocess.run(
                [sys.executable, "-m", "hpc_train.report.command", str(sweep_dir), "--no-png"],
                capture_output=True,
                text=True,
                cwd=REPO,
            )
            if f"states: {JOBS:,} COMPLETED" in report.stdout:
                break
            time.sleep(20)
        assert f"states: {JOBS:,} COMPLETED" in report.stdout, report.stdout[-2000:]
        assert sum(1 for n in range(JOBS) if (sweep_dir / str(n) / "probe.done").exists()) == JOBS
    finally:
        subprocess.run(["scancel", *arrays], check=False)
