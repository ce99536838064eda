"""hpc-train-report of Slurm jobs: a sweep on the Slurm test cluster, and the Slurm state of queued jobs."""

from __future__ import annotations

import subprocess
import time

import pytest

from tests.e2e.test_report import SWEEP, TRAIN, check_against_summaries, check_json, png_size, report, table
from tests.support.cli import assert_ok, run_cli

SLURM = [
    "launcher=slurm",
    "cluster.cpus_per_gpu=1",
    "cluster.time=5",
    "launcher.signal_delay_s=30",
    "resources.gpus_per_node=2",
]


@pytest.mark.slurm
def test_report_of_a_slurm_sweep(slurm_cluster, tmp_path):
    sweep_dir = tmp_path / "sweep"
    proc = run_cli(["-m", *SLURM, *TRAIN, SWEEP, "launcher.wait=true", f"hydra.sweep.dir={sweep_dir}"], timeout=400)
    assert_ok(proc)
    job_ids = [line.split("\t")[0] for line in (sweep_dir / "jobs.tsv").read_text().splitlines()[1:]]
    proc = report(str(sweep_dir))
    assert_ok(proc)
    check_against_summaries(proc.stdout, sweep_dir, ["single", "ddp", "model_parallel"])
    assert [r["slurm id"] for r in table(proc.stdout)] == job_ids
    png_size(sweep_dir / "report.png")
    check_json(sweep_dir)


@pytest.mark.slurm
def test_report_shows_the_slurm_state_of_queued_jobs(slurm_cluster, tmp_path):
    """Held jobs stay PENDING: the report says so for each job, with no numbers yet."""
    sweep_dir = tmp_path / "sweep"
    proc = run_cli(["-m", *SLURM, *TRAIN, SWEEP, "+cluster.extra.hold=true", f"hydra.sweep.dir={sweep_dir}"])
    assert_ok(proc)
    job_ids = [line.split("\t")[0] for line in (sweep_dir / "jobs.tsv").read_text().splitlines()[1:]]
    bases = sorted({j.split("_")[0] for j in job_ids})
    try:
        proc = report(str(sweep_dir))
        assert_ok(proc)
        rows = table(proc.stdout)
        assert [r["slurm id"] for r in rows] == job_ids
        assert [r["status"] for r in rows] == ["PENDING"] * 3
        assert all(r["samples/s"] == "-" and r["train loss"] == "-" for r in rows)
        assert [r["strategy"] for r in rows] == [
            "single",
            "ddp",
            "model_parallel",
        ]  # from job_config.yaml, before the job ran
        png_size(sweep_dir / "report.png")
        subprocess.run(["scancel", *bases], check=True)
        deadline = time.monotonic() + 60
        while True:
            statuses = [r["status"] for r in table(report(str(sweep_dir), "--no-png").stdout)]
            if statuses == ["CANCELLED"] * 3 or time.monotonic() > deadline:
                break
            time.sleep(1)
        assert statuses == ["CANCELLED"] * 3
    finally:
        subprocess.run(["scancel", *bases], capture_output=True)
