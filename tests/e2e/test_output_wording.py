"""What a run prints says what happened, in hpc-train's own words (help, rank lines, sweeps)."""

from __future__ import annotations

import re

from tests.support.cli import TINY, assert_ok, run_cli

ONE_EPOCH = [*TINY, "trainer.epochs=1", "data.num_samples=256"]


def test_help_opens_with_the_project_and_its_main_commands():
    proc = run_cli(["--help"])
    assert_ok(proc)
    assert proc.stdout.startswith("hpc-train: take PyTorch training from a laptop to a Slurm supercomputer")
    assert "hpc-train launcher=slurm dry_run=true" in proc.stdout and "hpc-train-report" in proc.stdout
    assert "powered by Hydra" not in proc.stdout


def test_rank_line_names_the_local_launcher_and_counts_agree(tmp_path):
    proc = run_cli([*ONE_EPOCH, "strategy=single"], tmp_path / "run")
    assert_ok(proc)
    assert "started by the local launcher" in proc.stdout and "from torchrun" not in proc.stdout
    assert re.search(r"global batch 64 = 1 rank x 64\b", proc.stdout), proc.stdout


def test_local_sweep_prints_one_prefix_and_ends_with_the_report_command(tmp_path):
    sweep = tmp_path / "sweep"
    proc = run_cli(["-m", *ONE_EPOCH, "strategy=single", "seed=1,2", f"hydra.sweep.dir={sweep}"])
    assert_ok(proc)
    job_lines = [line for line in proc.stdout.splitlines() if "#0" in line or "#1" in line]
    assert len(job_lines) == 2 and all(line.startswith("hpc-train: sweep job #") for line in job_lines), job_lines
    assert (
        proc.stdout.rstrip().splitlines()[-1]
        == f"hpc-train: sweep dir {sweep}; compare its jobs with: hpc-train-report {sweep}"
    )
