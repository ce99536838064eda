"""The requeue signal during a background checkpoint write on the Slurm test cluster: the loop stops at the next step
boundary, waits for the write, checkpoints that step, requeues, and the job resumes from it bit-identical."""

from __future__ import annotations

import os
import re
import subprocess
import time

import pytest

from tests.e2e.test_stop_during_checkpoint import (
    ARGS,
    EVERY,
    LAYOUTS,
    attempt_records,
    reference,  # noqa: F401  (a fixture)
    temporaries,
    writes_logged,
)
from tests.support.cli import assert_bit_identical, assert_ok, read_summary, run_cli, wait_for

SLURM = ["launcher=slurm", "cluster.cpus_per_gpu=1", "cluster.time=5", "launcher.signal_delay_s=30"]


SLURM_SLOW_WRITE_S = 2.5  # scancel's signal goes through slurmctld and slurmd (well under a second here)


@pytest.mark.slurm
def test_the_requeue_signal_during_a_checkpoint_write_requeues_and_resumes_bit_identical(
    slurm_cluster,
    reference,  # noqa: F811  (a fixture)
    tmp_path,
):
    from tests.slurm.test_requeue_slurm import attempt_endings, wait_until_finished_with_summary
    from tests.support.slurm import scontrol_job

    run_dir = tmp_path / "run"
    args = [*SLURM, *ARGS, *LAYOUTS["ddp"]]
    proc = run_cli(args, run_dir, env=dict(os.environ, HPC_TRAIN_SLOW_CHECKPOINT=str(SLURM_SLOW_WRITE_S)))
    assert_ok(proc)
    job = re.search(r"submitted Slurm job (\d+)", proc.stdout).group(1)
    finished = False
    try:
        wait_for(lambda: temporaries(run_dir) != [], 120, "the first checkpoint write to start")
        writing = temporaries(run_dir)
        sent_wall = time.time()
        subprocess.run(["scancel", "--signal=USR2", job], check=True)
        still = temporaries(run_dir)
        expected = reference("ddp")  # the local run while the job stops and waits in the queue to start again
        fields = wait_until_finished_with_summary(job, run_dir, timeout=240)
        finished = True
    finally:
        if not finished:
            subprocess.run(["scancel", job], check=False)
    assert writing and writing[0].startswith(f".step_{EVERY:09d}."), writing
    assert still == writing, f"the write ended before scancel returned ({writing} -> {still}): slow it down"

    assert fields["Restarts"] == "1", "the job must have requeued itself once"
    assert scontrol_job(job)["Restarts"] == "1"
    records = attempt_records(run_dir)
    first_end = [r for r in records if r["event"] == "end" and r["attempt"] == 1]
    # Written in the background, the save of step EVERY did not hold the loop: the stop came at a later step boundary.
    assert first_end and EVERY < first_end[0]["step"] < 16, records
    stopped_at = first_end[0]["step"]
    assert first_end[0]["time"] - sent_wall < 30, "the stop took longer than launcher.signal_delay_s"
    assert [a for a, _ in attempt_endings(run_dir)] == [1, 2] and attempt_endings(run_dir)[-1] == (2, "finish")
    summary = read_summary(run_dir)
    assert summary["attempts"] == 2 and summary["resumed_from_step"] == stopped_at and summary["global_step"] == 16
    assert len(writes_logged(run_dir, EVERY)) == 1, writes_logged(run_dir, EVERY)  # one write, completed
    assert temporaries(run_dir) == []
    assert "received SIGUSR2" in (run_dir / "slurm" / f"{job}_0_log.err").read_text()
    assert_bit_identical(expected, run_dir)
