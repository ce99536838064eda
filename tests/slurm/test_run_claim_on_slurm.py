"""One run dir, one live job, with a Slurm job as the holder: a local launch into its run dir is refused."""

from __future__ import annotations

import json
import re

import pytest

from hpc_train.records import run_claim
from tests.e2e.test_run_claim import PACED, starts
from tests.support.cli import assert_ok, read_summary, run_cli
from tests.support.slurm import wait_for_job_end


@pytest.mark.slurm
def test_a_local_launch_into_a_slurm_jobs_run_dir_is_refused(slurm_cluster, tmp_path):
    run_dir = tmp_path / "run"
    slurm = ["launcher=slurm", "cluster.cpus_per_gpu=1", "cluster.time=5", "resources.gpus_per_node=1"]
    proc = run_cli([*PACED, *slurm, "trainer.max_steps=30"], run_dir)
    assert_ok(proc)
    job = re.search(r"submitted Slurm job (\d+)", proc.stdout).group(1)
    assert json.loads((run_dir / run_claim.CLAIM).read_text())["slurm_job"] == job
    local = run_cli([*PACED, "trainer.max_steps=30"], run_dir)
    said = local.stdout + local.stderr
    assert local.returncode == 2 and f"in use by Slurm job {job}" in said and f"scancel {job}" in said, said
    assert "Traceback" not in said
    fields = wait_for_job_end(job, timeout=180)
    assert fields["JobState"] == "COMPLETED" and read_summary(run_dir)["global_step"] == 30
    assert len(starts(run_dir)) == 1 and not (run_dir / run_claim.CLAIM).exists()
