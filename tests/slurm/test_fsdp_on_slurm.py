"""FSDP on the Slurm test cluster: a two-node HSDP job is requeued, resumes and completes like the uninterrupted run."""

from __future__ import annotations

import re
import subprocess

import pytest

from tests.e2e.test_fsdp import (
    RESUME,
    uninterrupted,  # noqa: F401  (a fixture)
)
from tests.support.cli import assert_bit_identical, checkpoint_steps, read_summary, wait_for


@pytest.mark.slurm
def test_a_two_node_hsdp_job_requeues_resumes_and_completes(slurm_cluster, uninterrupted, tmp_path):  # noqa: F811
    """HSDP over 2 nodes x 1 task (replicas across nodes, each shard whole): stopped by the requeue signal after
    its first checkpoint, requeued by itself, resumed from its sharded checkpoint and bit-identical to the local
    2-rank fsdp run (the same 2 ranks, one gloo thread each)."""
    from tests.slurm.test_requeue_slurm import submit, wait_until_finished_with_summary

    run_dir = tmp_path / "run"
    hsdp = [*RESUME, "resources.nodes=2", "resources.gpus_per_node=1", "strategy.replicate=nodes"]
    job = submit(hsdp, run_dir, HPC_TRAIN_STEP_SLEEP="0.4")
    wait_for(lambda: checkpoint_steps(run_dir) != [], 120, "the first checkpoint")
    subprocess.run(["scancel", "--signal=USR2", job], check=True)
    fields = wait_until_finished_with_summary(job, run_dir, timeout=240)
    assert fields["Restarts"] == "1" and fields["NumNodes"] == "2", fields
    summary = read_summary(run_dir)
    assert summary["attempts"] == 2 and 3 <= summary["resumed_from_step"] < 24

    def accounted() -> str:  # slurmdbd records the end a moment after slurmctld
        return subprocess.run(
            ["sacct", "-j", job, "-X", "-n", "-P", "-o", "JobID,State,NNodes"], capture_output=True, text=True
        ).stdout

    wait_for(lambda: re.search(rf"^{job}\|COMPLETED\|2$", accounted(), flags=re.M), 60, "sacct to show COMPLETED")
    assert "sharded over 1 ranks x 2 replicas (HSDP)" in (run_dir / "logs" / "rank0.log").read_text()
    assert_bit_identical(uninterrupted, run_dir)
