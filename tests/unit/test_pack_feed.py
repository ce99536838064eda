"""An adaptive study's feed (hpc_train.pack.feed): a fed run is taken by one pool only, when it fits that pool now,
and is read from the allocations' records as a planned run is (no process, no Slurm: a pool's step start is
recorded instead of run)."""

from __future__ import annotations

from pathlib import Path
from typing import List

from hpc_train.pack import feed, records
from hpc_train.pack.records import AllocationPlan, PackedRun
from hpc_train.pack.scheduler import Scheduler


def run(job: str, gpus: int = 1) -> PackedRun:
    return PackedRun(job, f"/runs/{job.split('-')[0]}", "", 1, 1, gpus, 1, ["true"])


def pool(sweep_dir: Path, index: int, gpus: int, started: List[str], fed: bool = True) -> Scheduler:
    plan = AllocationPlan(index, 1, gpus, 8, 60, "USR2", 120, 3, [], str(100 + index), fed=fed)
    records.write_plan(sweep_dir, plan)
    scheduler = Scheduler(plan, sweep_dir, {"SLURM_JOB_ID": plan.job_id, "SLURM_JOB_NODELIST": "node1"})

    def start(the_run: PackedRun, nodes) -> None:  # the srun step's start, recorded instead of run
        for node in nodes:
            node.gpus -= the_run.gpus_per_node
        started.append(the_run.job)

    scheduler._start = start  # type: ignore[method-assign]
    return scheduler


def test_each_fed_run_goes_to_one_pool_with_room_for_it_and_is_read_as_its_run(tmp_path):
    first, second = [], []  # type: List[str], List[str]
    one, two = pool(tmp_path, 0, gpus=1, started=first), pool(tmp_path, 1, gpus=4, started=second)
    for job, gpus in (("0-1", 1), ("1-1", 2), ("2-1", 1)):
        feed.put(tmp_path, run(job, gpus))
    one._take_from_feed()  # room for one 1-GPU run: takes the first, leaves the 2-GPU one
    two._take_from_feed()
    assert first == ["0-1"] and second == ["1-1", "2-1"]
    assert list(feed.waiting(tmp_path)) == []
    assert sorted((index, entry.run.job) for index, entry in feed.claimed(tmp_path)) == [
        (0, "0-1"),
        (1, "1-1"),
        (1, "2-1"),
    ]
    states = records.run_states(tmp_path)
    assert {job: (s.state, s.job_id) for job, s in states.items()} == {
        "0-1": (records.WAITING, "100"),
        "1-1": (records.WAITING, "101"),
        "2-1": (records.WAITING, "101"),
    }
    assert [r.job for r in one.left()] == ["0-1"]  # a restarted pool resumes what it claimed
    records.append_event(tmp_path, 0, "ended", run="0-1", state=records.COMPLETED, exit_code=0, seconds=1.0)
    assert one.left() == []


def test_a_run_claimed_once_cannot_be_claimed_again(tmp_path):
    entry = feed.put(tmp_path, run("0-1"))
    assert feed.claim(tmp_path, entry, 0)
    assert not feed.claim(tmp_path, entry, 1)
    assert [index for index, _ in feed.claimed(tmp_path)] == [0]


def test_a_fed_pool_waits_for_the_feed_until_it_closes_and_a_fixed_plan_never_does(tmp_path):
    fed, fixed = pool(tmp_path, 0, 4, []), pool(tmp_path, 1, 4, [], fed=False)
    assert fed._feed_open() and not fixed._feed_open()
    feed.put(tmp_path, run("0-1"))
    feed.close(tmp_path)
    assert not fed._feed_open()
    assert [entry.run.job for entry in feed.withdraw(tmp_path)] == ["0-1"] and list(feed.waiting(tmp_path)) == []
