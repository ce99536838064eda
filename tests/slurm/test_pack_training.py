"""Packed sweeps of hpc_train's own training on the Slurm test cluster: runs as job steps of one allocation train
exactly as their own jobs do, and an allocation stopped mid-sweep (its time-limit signal, or ``scontrol requeue``)
skips its finished runs and resumes the interrupted ones from their own checkpoints when it starts again.

References are bit-identical: the same config, the same ranks (gloo, one thread each), the same data order.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List, Tuple

import pytest

from hpc_train.pack import records, status
from tests.support.cli import TINY, assert_bit_identical, assert_ok, checkpoint_steps, read_summary, run_cli, wait_for
from tests.support.paths import REPO

pytestmark = pytest.mark.slurm

SLURM = ["launcher=slurm", "cluster.cpus_per_gpu=1", "cluster.time=5", "launcher.signal_delay_s=30"]
DDP_FOUR = [*TINY, "trainer.max_steps=6", "trainer.eval=false", "strategy=ddp", "resources.gpus_per_node=2"]
SEEDS = "seed=1,2,3,4"
# Two quick runs (#0, #1: 2 steps) then two long ones (#2, #3: 40 steps, a checkpoint every 3) in one allocation with
# room for two runs at a time: the long ones start once the quick ones have finished.
MIXED = [
    *TINY,
    "trainer.epochs=null",
    "trainer.eval=false",
    "trainer.checkpoint_every=3",
    "strategy=single",
    "trainer.max_steps=2,40",
    "seed=7,8",
]
PACK_ONE = ["launcher.pack.allocations=1", "launcher.pack.gpus_per_node=2"]


def sweep(args: List[str], sweep_dir: Path, **env: str) -> None:
    proc = run_cli(["-m", *SLURM, *args, f"hydra.sweep.dir={sweep_dir}"], None, env=dict(os.environ, **env))
    assert_ok(proc)


def wait_until_all_ended(sweep_dir: Path, count: int, timeout: float) -> Dict[str, records.RunState]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        states = status.packed_states(sweep_dir)
        if len(states) == count and all(s.state in records.ENDED_STATES for s in states.values()):
            return states
        time.sleep(1)
    raise AssertionError(f"packed runs did not end within {timeout} s: {status.packed_states(sweep_dir)}")


def overlapping(events: List[dict]) -> int:
    """The most runs that were running at once, from an allocation's events."""
    running = most = 0
    for event in events:
        running += {"started": 1, "ended": -1}.get(event["event"], 0)
        most = max(most, running)
    return most


def test_four_ddp_runs_packed_in_one_allocation_train_as_their_own_jobs_do(slurm_cluster, tmp_path):
    packed, own = tmp_path / "packed", tmp_path / "own"
    sweep([*DDP_FOUR, SEEDS, "launcher.pack.allocations=1", "launcher.pack.gpus_per_node=4"], packed)
    sweep([*DDP_FOUR, SEEDS], own)  # one job each (an array)
    states = wait_until_all_ended(packed, 4, timeout=300)
    assert {s.state for s in states.values()} == {records.COMPLETED}
    plans = records.read_plans(packed)
    assert len(plans) == 1 and {s.job_id for s in states.values()} == {plans[0].job_id}  # one Slurm job ran all four
    assert overlapping(records.read_events(packed, 0)) == 2  # two 2-GPU runs at a time in 4 GPUs
    for job in map(str, range(4)):
        wait_for(lambda job=job: (own / job / "summary.json").exists(), 300, f"run {job} as its own job")
        mine, theirs = read_summary(packed / job), read_summary(own / job)
        assert mine["train_loss"] == theirs["train_loss"] and mine["world_size"] == theirs["world_size"] == 2
        assert_bit_identical(own / job, packed / job)


@pytest.fixture(scope="module")
def mixed_uninterrupted(tmp_path_factory) -> Path:
    """The same four runs packed and never stopped: queued here, beside the stopped sweeps; ended once read."""
    sweep_dir = tmp_path_factory.mktemp("uninterrupted")
    sweep([*MIXED, *PACK_ONE], sweep_dir)
    return sweep_dir


# The two ways an allocation is stopped mid-sweep: the time limit's signal, and a requeue from outside
STOPS = {"time-limit-signal": ["scancel", "--batch", "--signal=USR2"], "scontrol-requeue": ["scontrol", "requeue"]}


@pytest.fixture(scope="module")
def stopped_mid_sweep(slurm_cluster, tmp_path_factory) -> Dict[str, Tuple[Path, str, int, str]]:
    """The mixed sweep twice, side by side (one allocation's restart time, not two), slowed down and followed to its
    end (launcher.wait=true); once its long runs have a checkpoint, STOPS' command run on its allocation. (Sweep dir,
    the allocation's job id, the following command's exit code and what it printed) by STOPS' name."""
    folder = tmp_path_factory.mktemp("stopped")
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", HPC_TRAIN_STEP_SLEEP="0.3")
    clis: Dict[str, subprocess.Popen] = {}
    try:
        for name in STOPS:
            command = [sys.executable, "-m", "hpc_train.cli", "-m", *SLURM, *MIXED, *PACK_ONE, "launcher.wait=true"]
            clis[name] = subprocess.Popen(
                [*command, f"hydra.sweep.dir={folder / name}"],
                cwd=REPO,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
        stopped: Dict[str, str] = {}
        wait_for(lambda: stop_the_checkpointed(folder, stopped), 240, "the long runs' checkpoints in each sweep")
        said = {name: cli.communicate(timeout=360)[0] for name, cli in clis.items()}
    finally:
        for cli in clis.values():
            cli.kill()
    return {name: (folder / name, stopped[name], cli.returncode, said[name]) for name, cli in clis.items()}


def stop_the_checkpointed(folder: Path, stopped: Dict[str, str]) -> bool:
    """Run STOPS' command on each sweep's allocation (noted in `stopped`) once its long runs have a checkpoint."""
    for name in [name for name in STOPS if name not in stopped]:
        sweep_dir = folder / name
        plans = [plan for plan in records.read_plans(sweep_dir) if plan.job_id]
        if plans and checkpoint_steps(sweep_dir / "2") and checkpoint_steps(sweep_dir / "3"):
            stopped[name] = str(plans[0].job_id)
            subprocess.run([*STOPS[name], stopped[name]], check=True)
    return len(stopped) == len(STOPS)


@pytest.mark.parametrize("stop", sorted(STOPS, reverse=True))
def test_an_allocation_stopped_mid_sweep_skips_finished_runs_and_resumes_the_others(
    stop, mixed_uninterrupted, stopped_mid_sweep
):
    sweep_dir, job_id, returncode, out = stopped_mid_sweep[stop]
    uninterrupted = wait_until_all_ended(mixed_uninterrupted, 4, timeout=300)
    assert {s.state for s in uninterrupted.values()} == {records.COMPLETED}
    states = wait_until_all_ended(sweep_dir, 4, timeout=30)
    assert {s.state for s in states.values()} == {records.COMPLETED}
    # launcher.wait followed each run to the end of its last attempt: the two interrupted ones said so, none failed
    assert returncode == 0 and "failed" not in out, out
    interrupted = [line for line in out.splitlines() if "was interrupted (its allocation was requeued)" in line]
    assert [line.split()[3] for line in interrupted] == [f"{job_id}:2", f"{job_id}:3"], out
    assert out.strip().splitlines()[-1].startswith("hpc-train: sweep of 4 job(s) ended: 4 completed"), out
    events = records.read_events(sweep_dir, 0)
    began = [e for e in events if e["event"] == "began"]
    assert [e["restart"] for e in began] == [0, 1] and {e["job_id"] for e in began} == {job_id}
    second = events[events.index(began[1]) :]
    started_again = {e["run"] for e in second if e["event"] == "started"}
    assert started_again == {"2", "3"}, "the quick runs had finished: not rerun; the long ones resume"
    for job in ("2", "3"):
        summary = read_summary(sweep_dir / job)
        assert summary["attempts"] == 2 and 3 <= summary["resumed_from_step"] < 40
        assert_bit_identical(mixed_uninterrupted / job, sweep_dir / job)
    for job in ("0", "1"):
        assert read_summary(sweep_dir / job)["attempts"] == 1


HANGS_AT_STEP_3 = "trainer.step={_target_:tests.support.user_steps.sleeps_on_every_rank,_partial_:true}"


def test_a_packed_sweep_whose_run_hangs_ends_in_its_own_words_and_points_to_the_rerun(slurm_cluster, tmp_path):
    """Two runs in one allocation, followed (launcher.wait); the second hangs at step 3 and its watchdog stops it.
    The hung run's hint is a sweep's on Slurm (--rerun-failed reruns it alone; the sweep's command would start both
    again), and the terminal's last line is hpc-train's account of the sweep, not Hydra's `Error executing job`."""
    sweep_dir = tmp_path / "sweep"
    runs = ["strategy=single", "trainer.epochs=null", "trainer.eval=false", "trainer.max_steps=2,6"]
    args = [*SLURM, *TINY, *runs, "trainer.hang_timeout_s=6", HANGS_AT_STEP_3, *PACK_ONE, "launcher.wait=true"]
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", PYTHONUNBUFFERED="1")  # the lines in the order a terminal shows
    proc = subprocess.run(
        [sys.executable, "-m", "hpc_train.cli", "-m", *args, f"hydra.sweep.dir={sweep_dir}"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=REPO,
        env=env,
        timeout=400,
    )
    out = proc.stdout
    assert proc.returncode != 0 and "Error executing job" not in out, out
    lines = out.rstrip().splitlines()
    expected = "hpc-train: sweep of 2 job(s) ended: 1 completed, 1 did not (#1); compare them with: hpc-train-report"
    assert lines[-1] == f"{expected} {sweep_dir}", out
    hung = next(line for line in lines if line.startswith("hpc-train: the job hung"))
    assert hung.endswith(
        f"; rerun the sweep's jobs that did not complete with: hpc-train-report {sweep_dir} --rerun-failed (each"
        " resumes from its last checkpoint)"
    ), hung
