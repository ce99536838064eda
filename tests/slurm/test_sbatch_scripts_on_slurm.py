"""The plain sbatch scripts in sbatch/ really run on the Slurm test cluster: each strategy's script, an allocation that
does not match refused, the requeue signal resuming a plain sbatch job."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import List

import pytest

from tests.support.cli import TINY, read_summary
from tests.support.paths import REPO
from tests.support.slurm import scontrol_job, wait_for_job_end
from tests.unit.test_sbatch_script_per_strategy import SCRIPTS

# strategy -> (nodes, tasks per node) of the script as shipped
SHAPES = {"single": (1, 1), "dp": (1, 1), "ddp": (2, 4), "model_parallel": (1, 1), "pipeline": (1, 1), "hybrid": (2, 2)}


TRAIN = [*TINY, "trainer.max_steps=6", "trainer.epochs=null", "trainer.batch_size=32", "cluster.cpus_per_gpu=1"]


def submit(
    script: str, workdir: Path, run_dir: Path, args: List[str], sbatch_args: List[str] = (), **extra_env: str
) -> str:
    """`sbatch [options] sbatch/<script>.slurm ARGS` as a user would, with the CPU test overrides."""
    env = dict(os.environ, PYTHON=sys.executable, RUN_DIR=str(run_dir), **extra_env)
    command = [
        "sbatch",
        "--parsable",
        "--cpus-per-task=1",
        "--time=10",
        f"--chdir={workdir}",
        *sbatch_args,
        str(REPO / "sbatch" / f"{script}.slurm"),
        *args,
    ]
    proc = subprocess.run(command, capture_output=True, text=True, env=env, cwd=workdir, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip().split(";")[0]


# test_requeue_signal_resumes_a_plain_sbatch_job's job: hybrid.slurm, 30 slowed steps, a row every 2
REQUEUED = [*TRAIN, "trainer.max_steps=30", "trainer.log_every=2", "trainer.checkpoint_every=0"]


@pytest.fixture(scope="module")
def submitted(slurm_cluster, tmp_path_factory):
    """Every script submitted at once (the cluster runs what fits, queues the rest); waits for all. Submitted first,
    beside them: the requeue test's job, sent USR2 at its step 4 (it waits in the queue for its next attempt while
    the others run), and followed to its end."""
    root = tmp_path_factory.mktemp("sbatch")
    requeued = submit("hybrid", root, root / "requeued", REQUEUED, HPC_TRAIN_STEP_SLEEP="0.3")
    jobs = {name: submit(name, root, root / name, TRAIN) for name in SCRIPTS}
    signal_at_step_4(requeued, root / "requeued")
    ended = {name: wait_for_job_end(job_id, timeout=500) for name, job_id in jobs.items()}
    return root, jobs, ended, (requeued, wait_for_job_end(requeued, timeout=300))


def signal_at_step_4(job_id: str, run_dir: Path) -> None:
    """USR2 (what `#SBATCH --signal=B:USR2@120` sends, through the batch step's agent, before the time limit) once
    the job logged its step 4."""
    deadline = time.monotonic() + 180
    metrics = run_dir / "metrics.jsonl"
    while not (metrics.exists() and '"step": 4' in metrics.read_text()):
        assert time.monotonic() < deadline, "training did not start"
        assert scontrol_job(job_id).get("JobState") in ("PENDING", "CONFIGURING", "RUNNING"), scontrol_job(job_id)
        time.sleep(0.3)
    subprocess.run(["scancel", "--signal=USR2", job_id], check=True)


@pytest.mark.slurm
@pytest.mark.parametrize("name", SCRIPTS)
def test_script_runs_on_slurm(name, submitted):
    root, jobs, ended, _ = submitted
    run_dir, job_id = root / name, jobs[name]
    log = root / f"hpc-train-{job_id}.out"
    assert ended[name]["JobState"] == "COMPLETED", (
        ended[name].get("JobState"),
        log.read_text() if log.exists() else "no log",
    )
    nodes, tasks_per_node = SHAPES[name]
    world = nodes * tasks_per_node
    assert int(ended[name]["NumNodes"]) == nodes and int(ended[name]["NumTasks"]) == world
    summary = read_summary(run_dir)
    assert summary["strategy"] == name and summary["world_size"] == world and summary["global_step"] == 6
    # Every rank found its identity in srun's variables (no torchrun) and ran on the expected hosts.
    found = []
    for rank_log in sorted((run_dir / "logs").glob("rank*.log")):
        match = re.search(r"rank (\d+)/(\d+) \(local (\d+), started by ([^)]+)\) on host (\S+),", rank_log.read_text())
        found.append((int(match.group(1)), int(match.group(2)), match.group(4), match.group(5)))
    assert sorted(r[0] for r in found) == list(range(world))
    assert all(r[1] == world and r[2] == "srun" for r in found)
    assert len({r[3] for r in found}) == nodes
    assert "job spec" in log.read_text()  # the batch step wrote the spec before srun


@pytest.mark.slurm
def test_allocation_that_does_not_match_is_refused(slurm_cluster, tmp_path):
    """`sbatch --nodes=1 ddp.slurm` without resources.nodes=1: the batch step stops with the fix, no rank starts."""
    run_dir = tmp_path / "run"
    job_id = submit("ddp", tmp_path, run_dir, TRAIN, ["--nodes=1"])
    fields = wait_for_job_end(job_id, timeout=120)
    assert fields["JobState"] == "FAILED"
    log = (tmp_path / f"hpc-train-{job_id}.out").read_text()
    assert (
        "invalid configuration for `resources.nodes`" in log
        and "the allocation has 1 node(s), but the overrides plan 2" in log
        and "Fix:" in log
    )
    assert "Traceback" not in log
    assert not (run_dir / "job_config.yaml").exists() and not (run_dir / "logs").exists()


@pytest.mark.slurm
def test_requeue_signal_resumes_a_plain_sbatch_job(submitted):
    """USR2 (what `#SBATCH --signal=B:USR2@120` sends, through the batch step's agent, before the time limit), sent by
    the fixture at step 4: checkpoint, requeue, resume in RUN_DIR."""
    root, _, _, (job_id, fields) = submitted
    run_dir, metrics = root / "requeued", root / "requeued" / "metrics.jsonl"
    log = (root / f"hpc-train-{job_id}.out").read_text()
    assert fields["JobState"] == "COMPLETED", log
    assert int(fields.get("Restarts", "0")) == 1
    assert "received SIGUSR2" in log and "the batch host requeues the job" in log
    assert f"hpc-train: requeued job {job_id}" in log  # the batch script's agent, outside the ranks
    summary = read_summary(run_dir)
    assert summary["global_step"] == 30 and summary["attempts"] == 2
    assert 4 <= summary["resumed_from_step"] < 30
    steps = [int(m) for m in re.findall(r'"kind": "train", "step": (\d+)', metrics.read_text())]
    assert steps == list(range(2, 31, 2))  # one line per logged step, none lost or doubled across the requeue
