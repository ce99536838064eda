"""The hang watchdog on the real Slurm test cluster.

A 2-node ddp job, one task per node: rank 1 (on the second node, hpcnode2) sleeps for an hour in
its third step. The watchdog on rank 0 must name rank 1 on hpcnode2 with its sleeping frame and
end the job (FAILED, exit code 4); with trainer.requeue_on_hang=true it requeues the job once with
hpcnode2 excluded, read back from scontrol. (The requeued job starts again on two of the test cluster's
other nodes, never hpcnode2, hangs the same way and fails: requeued once, not again.)
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from hpc_train.records import rundir
from hpc_train.slurm.hostlist import expand_hostlist
from tests.support.cli import TINY, assert_ok, run_cli, wait_for
from tests.support.slurm import scontrol_job, wait_for_job_end

pytestmark = pytest.mark.slurm

HANG_S = 6
JOB = [
    *TINY,
    "launcher=slurm",
    "cluster.cpus_per_gpu=1",
    "cluster.time=5",
    "strategy=ddp",
    "resources.nodes=2",
    "resources.gpus_per_node=1",
    "trainer.epochs=null",
    "trainer.max_steps=40",
    "trainer.eval=false",
    f"trainer.hang_timeout_s={HANG_S}",
    "trainer.dist_timeout_s=120",
    "trainer.step={_target_:tests.support.user_steps.sleeps_on_rank_1,_partial_:true}",
]


def submit(args, run_dir: Path) -> str:
    proc = run_cli(args, run_dir, env=dict(os.environ))
    assert_ok(proc)
    return re.search(r"submitted Slurm job (\d+)", proc.stdout).group(1)


def away_from_hpcnode2(fields) -> bool:
    """Pending again, or running on nodes other than hpcnode2 (the suite's cluster has more than two)."""
    state = fields.get("JobState")
    return state == "PENDING" or (state == "RUNNING" and "hpcnode2" not in expand_hostlist(fields["NodeList"]))


def test_a_hang_on_the_second_node_is_named_and_fails_the_job(slurm_cluster, tmp_path):
    run_dir = tmp_path / "run"
    job = submit(JOB, run_dir)
    fields = wait_for_job_end(job, timeout=HANG_S + 120)
    assert fields["JobState"] == "FAILED", fields
    verdict = rundir.read_json(rundir.hang_file(run_dir))
    message = verdict["message"]
    assert "; rank 1 stuck:" in message and "rank 1 (host hpcnode2, pid" in message, message
    assert "is stuck in forward at step 3:" in message and "in sleeps_forever" in message
    assert "rank 0 is waiting for it" in message
    # the same message on the job's own output (rank 0's Slurm log), and both ranks' stacks in their logs
    assert "rank 1 (host hpcnode2" in (run_dir / rundir.SLURM_LOGS / f"{job}_0_log.err").read_text()
    assert "in sleeps_forever" in rundir.rank_log(run_dir, 1).read_text()
    assert "=== hpc-train: stacks of rank 0" in rundir.rank_log(run_dir, 0).read_text()
    assert [r["how"] for r in rundir.read_attempts(run_dir) if r["event"] == "end"][-1] == "hang"


def test_requeue_on_hang_requeues_once_without_the_culprits_node(slurm_cluster, tmp_path):
    run_dir = tmp_path / "run"
    job = submit([*JOB, "trainer.requeue_on_hang=true"], run_dir)
    try:
        wait_for(lambda: scontrol_job(job).get("Restarts") == "1", HANG_S + 120, "the job requeued")
        wait_for(lambda: scontrol_job(job).get("ExcNodeList") == "hpcnode2", 30, "hpcnode2 excluded")
        wait_for(
            lambda: away_from_hpcnode2(scontrol_job(job)), 60, "the requeued job pending or running without hpcnode2"
        )
        verdict = rundir.read_json(rundir.hang_file(run_dir))
        assert verdict["requeued"] is True
        said = "the batch host requeues the job once the ranks have stopped, excluding node hpcnode2"
        assert said in verdict["message"]
        # the batch host did it, outside the ranks (which may run in an image without Slurm's commands)
        batch_log = (run_dir / rundir.SLURM_LOGS / f"{job}_0_log.err").read_text()
        assert f"hpc-train: requeued job {job} once, excluding node hpcnode2" in batch_log
        # Once, not again: a second requeue could only follow the requeued attempt's own hang, so wait for that attempt
        # to end (it hangs the same way, on two other nodes) and read the count after it.
        fields = wait_for_job_end(job, timeout=HANG_S + 240)
        assert fields.get("Restarts") == "1" and fields["JobState"] == "FAILED", fields
    finally:
        subprocess.run(["scancel", job], check=False)
