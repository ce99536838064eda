"""Big sweeps within Slurm's limits, and watching a sweep, on the real Slurm test cluster.

The suite's test cluster cuts arrays at 200 tasks (MaxArraySize=201; the 16-node cluster of the scale tests keeps
Slurm's default 1001) and runs Slurm's default MaxJobCount=10000. Jobs that only
need to be queued (not run) are submitted held (``+cluster.extra.hold=true`` is sbatch --hold)
and cancelled at the end.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.e2e.test_sweep_status import FAIL_ENV, check_watch_output, watch
from tests.support.cli import TINY, assert_ok, run_cli
from tests.support.paths import REPO
from tests.support.slurm import scontrol_job

pytestmark = pytest.mark.slurm

SLURM = ["launcher=slurm", "cluster.cpus_per_gpu=1", "cluster.time=10", "model=toy_mlp", *TINY]
HELD = [*SLURM, "+cluster.extra.hold=true"]


def table_ids(sweep_dir: Path):
    return [line.split("\t")[0] for line in (sweep_dir / "jobs.tsv").read_text().splitlines()[1:]]


def cancel(job_ids) -> None:
    arrays = sorted({j.split("_")[0] for j in job_ids})
    if arrays:
        subprocess.run(["scancel", *arrays], check=False)


def queued(user: str = "root") -> int:
    out = subprocess.run(["squeue", "-h", "-r", "-u", user, "-o", "%i"], capture_output=True, text=True, check=True)
    return len(out.stdout.split())


def sweep_sizes(jobs: int) -> list:
    """The arrays a sweep of `jobs` goes in as: as many of MaxArraySize - 1 tasks as fit, then the rest."""
    from hpc_train.launch.planning.sweep_limits import array_chunk

    chunk = array_chunk()
    return [chunk] * (jobs // chunk) + ([jobs % chunk] if jobs % chunk else [])


# The suite's cluster cuts arrays at 200 tasks (MaxArraySize=201), so 220 held jobs show the cut in the default run;
# the 1,100-job sweep (two arrays at Slurm's default 1001, and the composing progress lines) is a scale test.
@pytest.mark.parametrize("jobs", [220, pytest.param(1100, marks=pytest.mark.scale)])
def test_a_sweep_bigger_than_max_array_size_goes_in_as_throttled_arrays(slurm_cluster, tmp_path, jobs):
    """Arrays cut under MaxArraySize, throttled to 16, chained, every job in jobs.tsv and counted by the report."""
    sweep_dir = tmp_path / "sweep"
    sizes = sweep_sizes(jobs)
    proc = run_cli(
        ["-m", *HELD, f"seed=range(0,{jobs})", "launcher.array_parallelism=16", f"hydra.sweep.dir={sweep_dir}"]
    )
    ids = table_ids(sweep_dir) if (sweep_dir / "jobs.tsv").exists() else []
    try:
        assert_ok(proc)
        assert len(sizes) >= 2, f"{jobs} jobs fit one array of this cluster: nothing to cut"
        if jobs >= 1000:  # a progress line every 1,000 jobs
            assert f"composed 1,000 of {jobs:,} jobs" in proc.stderr and f"laid out {jobs:,} of {jobs:,}" in proc.stderr
        arrays = sorted({i.split("_")[0] for i in ids}, key=int)
        assert len(ids) == jobs == len(set(ids)) and len(arrays) == len(sizes)
        tasks = {a: sorted(int(i.split("_")[1]) for i in ids if i.startswith(a + "_")) for a in arrays}
        assert [tasks[a] for a in arrays] == [list(range(size)) for size in sizes]
        # Slurm's own view: the task ranges and the throttle it really got
        for array, size in zip(arrays, sizes):
            assert scontrol_job(array)["ArrayTaskId"] == f"0-{size - 1}%16"
        assert scontrol_job(arrays[0])["ArrayTaskThrottle"] == "16"
        # throttled arrays run one after the other: the sweep as a whole runs at most 16 jobs at once
        for before, after in zip(arrays, arrays[1:]):
            assert scontrol_job(after)["Dependency"].startswith(f"afterany:{before}")
        # the report counts the states of all the jobs
        report = subprocess.run(
            [sys.executable, "-m", "hpc_train.report.command", str(sweep_dir), "--no-png"],
            capture_output=True,
            text=True,
            cwd=REPO,
        )
        assert report.returncode == 0, report.stderr
        assert f"states: {jobs:,} PENDING" in report.stdout
    finally:
        cancel(ids)


def test_a_refusal_part_way_cancels_the_arrays_already_queued(slurm_cluster, tmp_path):
    """Two sbatch groups; Slurm refuses the second: the first array is cancelled and nothing of the sweep is left."""
    sweep_dir = tmp_path / "sweep"
    before = queued()
    proc = run_cli(["-m", *HELD, "seed=0,1", "+cluster.extra.mail-type=END,NOT_A_TYPE", f"hydra.sweep.dir={sweep_dir}"])
    assert proc.returncode == 2, proc.stdout + proc.stderr
    message = proc.stderr
    assert "invalid configuration for `cluster.extra`" in message and "were cancelled" in message
    cancelled = re.search(r"had already queued \((\d+)\)", message).group(1)
    assert scontrol_job(cancelled)["JobState"] == "CANCELLED"
    assert queued() == before
    assert not (sweep_dir / "jobs.tsv").exists() and not (sweep_dir / "0").exists()
    assert not (sweep_dir / "slurm").exists() or not any((sweep_dir / "slurm").iterdir())


def _limit_hpctest(name: str, value: int) -> None:
    """Set a job-count limit on root's association with account hpctest (root's default account, root, is untouched)."""
    subprocess.run(
        ["sacctmgr", "-i", "modify", "user", "root", "where", "account=hpctest", "set", f"{name}={value}"],
        check=True,
        capture_output=True,
    )


@pytest.fixture
def max_submit_jobs():
    """MaxSubmitJobs on root's association with account hpctest."""
    yield lambda value: _limit_hpctest("maxsubmitjobs", value)
    _limit_hpctest("maxsubmitjobs", -1)


@pytest.fixture
def max_jobs():
    """MaxJobs (jobs running at once) on root's association with account hpctest."""
    yield lambda value: _limit_hpctest("maxjobs", value)
    _limit_hpctest("maxjobs", -1)


def test_a_sweep_over_max_jobs_goes_in_with_a_note_naming_the_throttle(slurm_cluster, tmp_path, max_jobs):
    """MaxJobs refuses nothing (the excess waits): a sweep charged to that association is told, with the fix; one
    charged to the default account, which has no such limit, is not."""
    max_jobs(2)
    for name, account in (("limited", ["cluster.account=hpctest"]), ("default", [])):
        proc = run_cli(["-m", *HELD, *account, "seed=range(0,4)", f"hydra.sweep.dir={tmp_path / name}"])
        try:
            assert_ok(proc)
            assert len(table_ids(tmp_path / name)) == 4
        finally:
            cancel(table_ids(tmp_path / name))
        noted = "runs at most 2 jobs at once (MaxJobs)" in proc.stderr and "launcher.array_parallelism=2" in proc.stderr
        assert noted == (name == "limited"), proc.stderr


def test_a_sweep_over_max_submit_jobs_is_refused_before_anything_is_queued(slurm_cluster, tmp_path, max_submit_jobs):
    max_submit_jobs(5)
    sweep_dir = tmp_path / "sweep"
    before = queued()
    proc = run_cli(["-m", *HELD, "cluster.account=hpctest", "seed=range(0,8)", f"hydra.sweep.dir={sweep_dir}"])
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "invalid configuration for `sweep`" in proc.stderr
    assert "queues 8 jobs" in proc.stderr and "MaxSubmitJobs of 5" in proc.stderr and "account hpctest" in proc.stderr
    assert "in parts of at most" in proc.stderr
    assert queued() == before and not (sweep_dir / "jobs.tsv").exists()
    # a sweep that names no account is charged to root's default account (root), which has no limit: it goes in
    proc = run_cli(["-m", *HELD, "seed=range(0,8)", f"hydra.sweep.dir={tmp_path / 'default'}"])
    try:
        assert_ok(proc)
        assert len(table_ids(tmp_path / "default")) == 8
    finally:
        cancel(table_ids(tmp_path / "default"))
    # within the limit it goes in
    proc = run_cli(["-m", *HELD, "cluster.account=hpctest", "seed=range(0,4)", f"hydra.sweep.dir={tmp_path / 'ok'}"])
    try:
        assert_ok(proc)
    finally:
        cancel(table_ids(tmp_path / "ok"))


# On Slurm the three jobs of the local watch's sweep (tests/e2e/test_sweep_status.py) run at once, and the ETA shows
# only while some job has ended and another has not: here job 2 fails after 9 steps and the others stop at 2, so that
# moment lasts about 5 s (with 4 steps against 5, it lasted the 0.7 s of one step, which a watch refreshing every
# second could miss).
FAILING_AT_ONCE = ["trainer.max_steps=2,10,2", "trainer.log_every=1", "trainer.eval=false"]
FAIL_LATE_ENV = {**FAIL_ENV, "HPC_TRAIN_FAIL_AT": "0:9"}


def test_watch_follows_a_slurm_sweep_in_which_one_job_fails(slurm_cluster, tmp_path):
    sweep_dir = tmp_path / "sweep"
    env = dict(os.environ, **FAIL_LATE_ENV)
    proc = run_cli(["-m", *SLURM, "strategy=single", *FAILING_AT_ONCE, f"hydra.sweep.dir={sweep_dir}"], env=env)
    assert_ok(proc)
    check_watch_output(watch(sweep_dir, timeout=300), failed_job="1")
    report = subprocess.run(
        [sys.executable, "-m", "hpc_train.report.command", str(sweep_dir), "--no-png"],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    assert "states: 2 COMPLETED, 1 FAILED" in report.stdout
