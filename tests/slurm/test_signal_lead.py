"""A stop signal's lead time too short for a step plus a checkpoint is warned about."""

import os
import re

import pytest

from tests.support.cli import TINY, assert_ok, run_cli
from tests.support.slurm import wait_for_job_end

pytestmark = pytest.mark.slurm


def test_a_lead_time_shorter_than_a_step_and_a_checkpoint_is_warned_about(slurm_cluster, tmp_path):
    run_dir = tmp_path / "run"
    args = [
        *TINY,
        "launcher=slurm",
        "cluster.cpus_per_gpu=1",
        "cluster.time=5",
        "launcher.signal_delay_s=1",
        "strategy=single",
        "resources.gpus_per_node=1",
        "trainer.epochs=null",
        "trainer.max_steps=6",
        "trainer.checkpoint_every=3",
        "trainer.eval=false",
    ]
    proc = run_cli(args, run_dir, env=dict(os.environ, HPC_TRAIN_STEP_SLEEP="1.5"))
    assert_ok(proc)
    job = re.search(r"submitted Slurm job (\d+)", proc.stdout).group(1)
    assert wait_for_job_end(job, timeout=180)["JobState"] == "COMPLETED"
    log = (run_dir / "logs" / "rank0.log").read_text()
    warning = re.search(
        r"launcher\.signal_delay_s=1 is shorter than one step plus a checkpoint \(measured (\d+) s", log
    )
    assert warning and int(warning.group(1)) >= 1, log
    # Saves are written in the background (the default): a stop may first wait for the one in flight, so the measure
    # counts two saves.
    assert "the one in flight and the stop's own" in log, log
    assert log.count("is shorter than one step") == 1  # once, at the first checkpoint
