"""resources.nodes=2-4 on the Slurm test cluster (4 nodes): started while only 2 are free, requeued onto 4.

Another job holds 2 of the 4 nodes (`sbatch -N2 --exclusive`), so the ddp job of 2-4 nodes x 1 GPU starts on the 2
left, with world size 2 (read back from scontrol). Once it has checkpointed, the held nodes are freed and the job
is requeued (`scontrol requeuehold`, released once all 4 nodes are idle, so that it cannot start again on the 2 it
had while Slurm cleans up after it); it starts on 4 nodes, reshards its checkpoint from 2 ranks to 4 and ends equal,
within 1e-4, to an uninterrupted 4-node run. sacct lists both runs of the job: 2 nodes, then 4.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from tests.slurm.test_requeue_slurm import wait_until_finished_with_summary
from tests.support.cli import TINY, assert_ok, checkpoint_steps, final_weights, read_summary, run_cli, wait_for
from tests.support.slurm import scontrol_job, wait_for_job_end

pytestmark = pytest.mark.slurm

# A global batch of 24 splits over 2, 3 and 4 ranks (every count of the range is checked before submitting).
TRAIN = [
    *TINY,
    "trainer.epochs=null",
    "trainer.max_steps=12",
    "trainer.eval=false",
    "trainer.batch_size=24",
    "trainer.checkpoint_every=2",
]
SLURM = ["launcher=slurm", "cluster.cpus_per_gpu=1", "cluster.time=5", "strategy=ddp", "resources.gpus_per_node=1"]


def submit(args, run_dir: Path, **env_extra) -> str:
    proc = run_cli([*SLURM, *TRAIN, *args], run_dir, env=dict(os.environ, **env_extra))
    assert_ok(proc)
    return re.search(r"submitted Slurm job (\d+)", proc.stdout).group(1)


def idle_nodes() -> int:
    out = subprocess.run(
        ["sinfo", "-h", "-p", "debug", "-t", "idle", "-o", "%D"], capture_output=True, text=True, check=True
    ).stdout
    return sum(int(n) for n in out.split())


def runs_of(job: str):
    """(nodes, state) of each run of the job, requeued ones included, from accounting."""
    out = subprocess.run(
        ["sacct", "-j", job, "-D", "-X", "-n", "-P", "-o", "NNodes,State"], capture_output=True, text=True, check=True
    ).stdout
    return [(int(nodes), state.split()[0]) for nodes, state in (line.split("|") for line in out.split())]


@pytest.fixture(scope="module")
def four_nodes(slurm_cluster, tmp_path_factory):
    """The uninterrupted reference: the same job on 4 nodes."""
    run_dir = tmp_path_factory.mktemp("four-nodes")
    assert_ok(run_cli([*SLURM, *TRAIN, "resources.nodes=4", "launcher.wait=true"], run_dir))
    assert read_summary(run_dir)["world_size"] == 4
    return run_dir


def test_a_range_starts_on_the_free_nodes_and_resumes_on_more_after_a_requeue(four_nodes, tmp_path):
    run_dir = tmp_path / "run"
    holder = subprocess.run(
        [
            "sbatch",
            "--parsable",
            "-N2",
            "--exclusive",
            "-p",
            "debug",
            "-J",
            "hold-two-nodes",
            "--time=5",
            "--wrap",
            "sleep 600",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    job = None
    try:
        wait_for(lambda: scontrol_job(holder).get("JobState") == "RUNNING", 60, "the holding job to run")
        job = submit(["resources.nodes=2-4"], run_dir, HPC_TRAIN_STEP_SLEEP="0.5")
        wait_for(
            lambda: scontrol_job(job).get("JobState") == "RUNNING", 60, "the flexible job to start on the free nodes"
        )
        fields = scontrol_job(job)
        assert fields["NumNodes"] == "2" and fields["NumTasks"] == "2", fields
        wait_for(lambda: checkpoint_steps(run_dir) != [], 120, "its first checkpoint")

        subprocess.run(["scancel", holder], check=True)
        wait_for_job_end(holder, timeout=60)
        subprocess.run(["scontrol", "requeuehold", job], check=True)
        wait_for(
            lambda: scontrol_job(job).get("JobState") == "PENDING" and idle_nodes() == 4,
            90,
            "the job held and all 4 nodes idle",
        )
        subprocess.run(["scontrol", "release", job], check=True)
        fields = wait_until_finished_with_summary(job, run_dir, timeout=180)
    finally:
        subprocess.run(["scancel", holder, *([job] if job else [])], check=False)

    assert fields["NumNodes"] == "4" and fields["Restarts"] == "1", fields
    assert runs_of(job) == [(2, "REQUEUED"), (4, "COMPLETED")]
    summary = read_summary(run_dir)
    assert summary["world_size"] == 4 and summary["attempts"] == 2 and summary["resumed_from_step"] >= 2
    assert "written by 2 ranks and is resumed by 4" in (run_dir / "logs" / "rank0.log").read_text()
    a, b = final_weights(four_nodes), final_weights(run_dir)
    assert a.keys() == b.keys() and max((a[k] - b[k]).abs().max().item() for k in a) <= 1e-4
