"""Requeue, resume and fail-fast on the real local Slurm cluster.

The requeue signal is sent by hand (``scancel --signal=USR2``), as Slurm itself sends it
``launcher.signal_delay_s`` before the time limit. The reference is the same config run
locally without interruption: both sides run 2 gloo ranks with one thread each, so the final
weights must be bit-identical.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from datetime import datetime
from pathlib import Path
from typing import Dict, Tuple

import pytest

from tests.e2e.test_checkpoint import RESUME, assert_bit_identical, checkpoint_steps, reference, wait_for
from tests.support.cli import assert_ok, read_summary, run_cli
from tests.support.slurm import scontrol_job, wait_for_job_end

pytestmark = pytest.mark.slurm

SLURM = ["launcher=slurm", "cluster.cpus_per_gpu=1", "cluster.time=5", "launcher.signal_delay_s=30"]
DDP = ["strategy=ddp", "resources.gpus_per_node=2"]


def submit(args, run_dir: Path, **env_extra) -> str:
    proc = run_cli([*SLURM, *args], run_dir, env=dict(os.environ, **env_extra))
    assert_ok(proc)
    return re.search(r"submitted Slurm job (\d+)", proc.stdout).group(1)


def attempt_endings(run_dir: Path):
    records = [json.loads(line) for line in (run_dir / "attempts.jsonl").read_text().splitlines()]
    return [(r["attempt"], r["how"]) for r in records if r["event"] == "end"]


def wait_until_finished_with_summary(job_id: str, run_dir: Path, timeout: float) -> dict:
    """A requeued job passes through REQUEUED/PENDING before running again: wait for the final end."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        fields = scontrol_job(job_id)
        if fields.get("JobState") == "COMPLETED" and (run_dir / "summary.json").exists():
            return fields
        if fields.get("JobState") in ("FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL"):
            raise AssertionError(f"job {job_id} ended {fields.get('JobState')}")
        time.sleep(1)
    raise AssertionError(
        f"job {job_id} did not finish within {timeout} s (state {scontrol_job(job_id).get('JobState')})"
    )


@pytest.fixture(scope="module")
def local_reference(tmp_path_factory):
    """tests/e2e/test_checkpoint.py's uninterrupted ddp run (the same 2 ranks), computed once a session."""
    return reference(tmp_path_factory, "ddp")


# The same ddp job twice, with and without requeues left; each sent the requeue signal at its first checkpoint
SIGNALLED = {"requeued": [], "no-requeue-left": ["trainer.max_requeues=0"]}


@pytest.fixture(scope="module")
def signalled(slurm_cluster, tmp_path_factory) -> Dict[str, Tuple[str, Path]]:
    """SIGNALLED's jobs side by side (one requeue's time, not two), each sent USR2 once it wrote its first
    checkpoint; (Slurm id, run dir) by name. The tests follow them to their ends."""
    folder = tmp_path_factory.mktemp("signalled")
    jobs = {name: submit([*RESUME, *DDP, *extra], folder / name, HPC_TRAIN_STEP_SLEEP="0.4")
            for name, extra in SIGNALLED.items()}  # fmt: skip
    waiting = dict(jobs)

    def signal_the_checkpointed() -> bool:
        for name, job in list(waiting.items()):
            if checkpoint_steps(folder / name) != []:
                subprocess.run(["scancel", "--signal=USR2", job], check=True)
                del waiting[name]
        return not waiting

    wait_for(signal_the_checkpointed, 120, "the first checkpoint of each job")
    return {name: (job, folder / name) for name, job in jobs.items()}


# local_reference first: run beside the two jobs, its ranks slowed them on two cores more than it saved
def test_requeue_signal_checkpoints_requeues_and_resumes_exactly(local_reference, signalled):
    job, run_dir = signalled["requeued"]
    fields = wait_until_finished_with_summary(job, run_dir, timeout=240)
    assert fields["Restarts"] == "1", "the job must have requeued itself once"
    summary = read_summary(run_dir)
    assert summary["attempts"] == 2
    assert 3 <= summary["resumed_from_step"] < 24
    # submitit calls a stop in the last 80% of a job's time (or, for jobs under 10 minutes, any
    # stop) a timeout; a stop earlier in a long job is a preemption.
    assert attempt_endings(run_dir) == [(1, "timeout"), (2, "finish")]
    rank0 = (run_dir / "logs" / "rank0.log").read_text()
    assert "received SIGUSR2" in (run_dir / "slurm" / f"{job}_0_log.err").read_text()
    assert "checkpoint step_" in rank0 and "(stop signal" in rank0
    assert_bit_identical(local_reference, run_dir)


def test_requeues_stop_at_max_requeues_and_keep_the_checkpoint(signalled):
    job, run_dir = signalled["no-requeue-left"]
    fields = wait_for_job_end(job, timeout=120)
    assert fields["JobState"] == "FAILED" and fields["Restarts"] == "0"
    assert not (run_dir / "summary.json").exists()
    stopped_at = max(checkpoint_steps(run_dir))
    assert 3 <= stopped_at < 24
    assert "not requeuing: 1 attempts already, trainer.max_requeues=0" in (run_dir / "logs" / "rank0.log").read_text()
    # ... and the same command, re-run by hand, continues from that checkpoint.
    proc = run_cli([*SLURM, *RESUME, *DDP, "launcher.wait=true"], run_dir)
    assert_ok(proc)
    assert read_summary(run_dir)["resumed_from_step"] == stopped_at


def test_a_failing_rank_fails_the_slurm_job_fast_with_its_traceback(slurm_cluster, tmp_path):
    run_dir = tmp_path / "run"
    timeout_s = 60
    job = submit([*RESUME, *DDP, f"trainer.dist_timeout_s={timeout_s}"], run_dir, HPC_TRAIN_FAIL_AT="1:4")
    fields = wait_for_job_end(job, timeout=120)
    assert fields["JobState"] == "FAILED"
    assert fields["Restarts"] == "0", "a crash must not be requeued"
    # Fast: from rank 1's failure (its log's last write, the traceback) to the job's end (Slurm's EndTime, to the
    # second), less than the collective timeout rank 0 would otherwise sit out; not the job's run time, which counts
    # the start of both nodes' ranks on loaded cores.
    ended = datetime.strptime(fields["EndTime"], "%Y-%m-%dT%H:%M:%S").timestamp()
    after_failure = ended - (run_dir / "logs" / "rank1.log").stat().st_mtime
    assert after_failure < timeout_s, f"the job ended {after_failure:.0f} s after rank 1 failed: the collective timeout"
    rank1 = (run_dir / "logs" / "rank1.log").read_text()
    assert "Traceback" in rank1 and "InjectedFailure: HPC_TRAIN_FAIL_AT=1:4" in rank1
    assert attempt_endings(run_dir) in ([], [(1, "crash")])  # rank 0 may be stopped before it can write
    assert not (run_dir / "summary.json").exists()


def node_state(node: str) -> str:
    return (
        subprocess.run(["sinfo", "-h", "-N", "-n", node, "-o", "%T"], capture_output=True, text=True, check=False)
        .stdout.split("\n")[0]
        .strip()
    )


def restore_node(node: str) -> None:
    """Give the node back to the cluster whatever state the test left it in (other tests share it)."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        state = node_state(node)
        if state and not any(word in state for word in ("down", "drain", "fail")):
            return
        subprocess.run(["scontrol", "update", f"nodename={node}", "state=resume"], capture_output=True, check=False)
        time.sleep(1)
    raise AssertionError(
        f"node {node} is still {node_state(node)!r}: run `scontrol update nodename={node} state=resume`"
    )


def test_node_failure_requeues_and_resumes_exactly(slurm_cluster, local_reference, tmp_path):
    """A node of a 2-node ddp job declared down, as Slurm declares a failed node: requeue, resume, same weights.

    ``state=down`` makes slurmctld end the job as NODE_FAIL and, the job being ``--requeue``,
    put it back in the queue; it starts again once both nodes are up. (Killing the processes
    instead would end the step through ``--kill-on-bad-exit`` as a crash, never requeued.)
    """
    run_dir = tmp_path / "run"
    job = submit(
        [*RESUME, "strategy=ddp", "resources.nodes=2", "resources.gpus_per_node=1"], run_dir, HPC_TRAIN_STEP_SLEEP="1.0"
    )
    node, finished = None, False
    try:
        wait_for(lambda: checkpoint_steps(run_dir) != [], 180, "the first checkpoint")
        hosts = subprocess.run(
            ["scontrol", "show", "hostnames", scontrol_job(job)["NodeList"]], capture_output=True, text=True, check=True
        ).stdout.split()
        assert len(hosts) == 2
        node = hosts[-1]  # rank 1's node; rank 0 (and the rendezvous) sit on the first
        # No other test's job may start there meanwhile; give those already running a moment to end.
        subprocess.run(
            ["scontrol", "update", f"nodename={node}", "state=drain", "reason=hpc-train test: node failure next"],
            check=True,
        )
        deadline = time.monotonic() + 8
        while time.monotonic() < deadline and set(
            subprocess.run(["squeue", "-h", "-w", node, "-o", "%A"], capture_output=True, text=True).stdout.split()
        ) - {job}:
            time.sleep(0.5)
        assert scontrol_job(job)["JobState"] == "RUNNING", "the job ended before its node could fail: slow it down"
        subprocess.run(
            ["scontrol", "update", f"nodename={node}", "state=down", "reason=hpc-train test: node failure"], check=True
        )
        wait_for(lambda: scontrol_job(job).get("Restarts") == "1", 60, "Slurm to requeue the job")
        restore_node(node)  # the requeued job needs both nodes again
        fields = wait_until_finished_with_summary(job, run_dir, timeout=240)
        finished = True
    finally:
        if node is not None:
            restore_node(node)
        if not finished:
            subprocess.run(["scancel", job], check=False)

    assert fields["Restarts"] == "1"
    summary = read_summary(run_dir)
    assert summary["attempts"] == 2
    assert 3 <= summary["resumed_from_step"] < 24
    records = [json.loads(line) for line in (run_dir / "attempts.jsonl").read_text().splitlines()]
    said = [r for r in records if r["event"] == "end" and r.get("source") == "slurm"]
    assert [(r["attempt"], r["how"]) for r in said] == [(1, "node failure (Slurm: NODE_FAIL)")]
    assert attempt_endings(run_dir)[-1] == (2, "finish")
    assert (
        f"attempt 1 (job {job}) ended: node failure (Slurm: NODE_FAIL)" in (run_dir / "logs" / "rank0.log").read_text()
    )
    assert_bit_identical(local_reference, run_dir)
