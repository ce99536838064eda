"""What a run prints says what happened, in hpc-train's own words (help, rank lines, sweeps)."""

from __future__ import annotations

import os
import re
import subprocess
import sys

from tests.support.cli import TINY, assert_ok, run_cli
from tests.support.paths import REPO

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
        == f"hpc-train: sweep of 2 job(s) ended: 2 completed; compare them with: hpc-train-report {sweep}"
    )


HANGS_AT_STEP_3 = "trainer.step={_target_:tests.support.user_steps.sleeps_on_every_rank,_partial_:true}"


def test_a_local_sweep_whose_job_hangs_ends_in_its_own_words_with_the_hint_of_a_sweep(tmp_path):
    """Two jobs, the second stopped by its hang watchdog: the terminal's last line is hpc-train's account of the sweep
    (not Hydra's `Error executing job with overrides`), and the hung job's hint is how a sweep's job goes on (the
    sweep's command again into its sweep dir: no job table, so no --rerun-failed), not a run's "the same command"."""
    sweep = tmp_path / "sweep"
    jobs = ["trainer.epochs=null", "trainer.eval=false", "trainer.max_steps=2,6", "trainer.hang_timeout_s=6"]
    command = [sys.executable, "-m", "hpc_train.cli", "-m", *TINY, "strategy=single", *jobs, HANGS_AT_STEP_3]
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", PYTHONUNBUFFERED="1")  # the lines in the order a terminal shows
    proc = subprocess.run(
        [*command, f"hydra.sweep.dir={sweep}"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=REPO,
        env=env,
        timeout=240,
    )
    lines = proc.stdout.rstrip().splitlines()
    assert proc.returncode == 4, proc.stdout  # the hung job's exit code
    assert "Error executing job" not in proc.stdout, proc.stdout
    assert lines[-1] == (
        f"hpc-train: sweep of 2 job(s) ended: 1 completed, 1 did not (#1); compare them with: hpc-train-report {sweep}"
    ), proc.stdout
    hung = next(line for line in lines if line.startswith("hpc-train: the job hung"))
    assert hung.endswith(
        f"; run the sweep's command again with hydra.sweep.dir={sweep} to resume its jobs from their last"
        " checkpoints (its finished jobs are left as they are)"
    ), hung
