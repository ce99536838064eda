"""A followed Slurm job whose rank refuses the user's step ends with the refusal and exit code 2."""

from __future__ import annotations

import pytest

from tests.e2e.test_user_step import step_node
from tests.support.cli import TINY, run_cli


@pytest.mark.slurm
def test_a_followed_slurm_job_whose_rank_refuses_ends_with_the_refusal_and_exit_code_2(slurm_cluster, tmp_path):
    """launcher.wait=true: the rank's one message, exit code 2 and a last line saying it refused to start, as a local
    run says, not 'failed (exit code 1)'."""
    slurm = ["launcher=slurm", "launcher.wait=true", "cluster.cpus_per_gpu=1", "cluster.time=5"]
    proc = run_cli(
        [*TINY, *slurm, "strategy=single", step_node("tests.support.user_steps.no_loss_key")], tmp_path / "run"
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2, out
    assert "`trainer.step`" in out and "without a 'loss' key" in out and "Traceback" not in out, out
    assert out.strip().splitlines()[-1].startswith("hpc-train: the job refused to start (exit code 2)"), out
