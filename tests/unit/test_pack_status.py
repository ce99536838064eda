"""Where a packed sweep's runs stand (hpc_train.pack.status): the pool's records merged with Slurm's word on each
allocation, read once for all runs. Slurm is a stand-in here (job_states.slurm_states patched)."""

import json

import pytest

from hpc_train.jobs import job_states
from hpc_train.pack import records, status
from hpc_train.pack.records import AllocationPlan, PackedRun, RunState


def run(job: str) -> PackedRun:
    return PackedRun(job, f"/sweep/{job}", f"x={job}", 1, 1, 1, 1, ["python", "job.py"])


def plan(index: int, job_id: str, jobs) -> AllocationPlan:
    return AllocationPlan(index, 1, 4, 4, 5, "USR2", 120, 3, [run(j) for j in jobs], job_id)


def events(sweep, index, *lines):
    path = records.events_path(sweep, index)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as handle:
        for line in lines:
            handle.write(json.dumps(line) + "\n")


@pytest.fixture
def slurm(monkeypatch):
    """Slurm's states of the allocations, as the test sets them; counts the calls."""
    said = {"states": {}, "calls": 0}

    def slurm_states(ids, run_dirs=None):
        said["calls"] += 1
        return {i: said["states"][i] for i in ids if i in said["states"]}

    def queue_states(ids):
        said["squeue"] += 1
        return {i: said["queue"][i] for i in ids if i in said["queue"]}

    said.update(queue={}, squeue=0)
    monkeypatch.setattr(job_states, "slurm_states", slurm_states)
    monkeypatch.setattr(job_states, "queue_states", queue_states)
    return said


@pytest.mark.parametrize(
    "recorded, allocation, over, expected",
    [
        (records.WAITING, "PENDING", False, records.WAITING),  # just queued
        (records.WAITING, None, False, records.WAITING),  # Slurm does not know it yet: live
        (records.RUNNING, "RUNNING", False, records.RUNNING),
        (records.RUNNING, "PENDING", False, records.INTERRUPTED),  # requeued under it (node failure, admin)
        (records.RUNNING, "REQUEUED", False, records.INTERRUPTED),
        (records.INTERRUPTED, "PENDING", False, records.INTERRUPTED),  # checkpointed on the signal, requeued
        (records.INTERRUPTED, "RUNNING", False, records.INTERRUPTED),  # restarted, not started again yet
        (records.WAITING, "CANCELLED", False, records.CANCELLED),  # its allocation ended for good
        (records.RUNNING, "TIMEOUT", False, records.CANCELLED),
        (records.INTERRUPTED, "FAILED", False, records.CANCELLED),
        (records.WAITING, "RUNNING", True, records.CANCELLED),  # its scheduler finished without it
        (records.FAILED, "RUNNING", False, records.FAILED),  # an ended run keeps its end
        (records.COMPLETED, "CANCELLED", False, records.COMPLETED),
        (records.FAILED, "PENDING", True, records.FAILED),
    ],
)
def test_a_runs_state_is_its_records_corrected_by_its_allocations(recorded, allocation, over, expected):
    state = RunState(recorded, 0, "7", None, 1.0 if recorded != records.WAITING else None)
    assert status.merged(state, allocation, over).state == expected


def test_run_seconds_so_far_or_in_all():
    assert status.run_seconds(RunState(records.WAITING, 0, "7")) is None
    assert status.run_seconds(RunState(records.RUNNING, 0, "7", None, 100.0), now=130.0) == 30.0
    assert status.run_seconds(RunState(records.FAILED, 0, "7", 1, 100.0, 112.5), now=500.0) == 12.5


def test_one_reading_gives_every_run_and_allocation_with_one_slurm_call(tmp_path, slurm):
    records.write_plan(tmp_path, plan(0, "41", ["0", "2", "4"]))
    records.write_plan(tmp_path, plan(1, "42", ["1", "3"]))
    events(
        tmp_path,
        0,
        {"time": 10, "event": "started", "run": "0"},
        {"time": 20, "event": "ended", "run": "0", "state": "COMPLETED", "exit_code": 0},
    )
    events(tmp_path, 0, {"time": 21, "event": "started", "run": "2"})
    events(
        tmp_path,
        1,
        {"time": 10, "event": "started", "run": "1"},
        {"time": 11, "event": "ended", "run": "1", "state": "FAILED", "exit_code": 1},
    )
    events(tmp_path, 1, {"time": 12, "event": "finished", "not_completed": ["1", "3"]})
    slurm["states"] = {"41": "RUNNING", "42": "RUNNING"}  # 42's scheduler has finished; Slurm has not seen it end yet
    found = status.read(tmp_path)
    assert slurm["calls"] == 1 and slurm["squeue"] == 0
    assert {job: state.state for job, state in found.runs.items()} == {
        "0": "COMPLETED",
        "2": "RUNNING",
        "4": "WAITING",
        "1": "FAILED",
        "3": "CANCELLED",
    }
    assert found.allocations == {"41": "RUNNING", "42": "RUNNING"} and found.indices == {"41": 0, "42": 1}
    assert found.of("41:2").state == "RUNNING" and found.of("41:9") is None
    assert found.run_dirs == {job: f"/sweep/{job}" for job in "02413"}
    assert status.allocation_states(tmp_path) == {0: "RUNNING", 1: "RUNNING"}


def test_a_rerun_allocation_has_its_runs_from_then_on_and_an_old_id_follows_its_run(tmp_path, slurm):
    records.write_plan(tmp_path, plan(0, "41", ["0", "1"]))
    events(
        tmp_path,
        0,
        {"time": 10, "event": "started", "run": "1"},
        {"time": 11, "event": "ended", "run": "1", "state": "FAILED", "exit_code": 1},
    )
    records.write_plan(tmp_path, plan(1, "50", ["1"]))
    slurm["states"] = {"41": "RUNNING", "50": "PENDING"}
    found = status.read(tmp_path)
    assert found.of("41:1") == found.of("50:1") == RunState(records.WAITING, 1, "50")


def test_the_shared_states_of_a_sweep_ask_once_per_refresh(tmp_path, slurm):
    records.write_plan(tmp_path, plan(0, "41", ["0", "1", "2"]))
    slurm["states"] = {"41": "PENDING"}
    shared = status.SharedPackedStates(tmp_path, max_age_s=60)
    assert [shared.get(f"41:{n}") for n in "012"] == ["WAITING"] * 3
    assert shared.get("41:7") is None
    assert slurm["calls"] == 1
    slurm["states"] = {"41": "CANCELLED"}
    assert shared.get("41:0") == "WAITING"  # within max_age_s: the reading kept
    stale = status.SharedPackedStates(tmp_path, max_age_s=0)
    assert stale.get("41:0") == "CANCELLED" and slurm["calls"] == 2


@pytest.mark.parametrize(
    "squeue, expected", [("RUNNING", "RUNNING"), ("PENDING", "INTERRUPTED"), (None, "INTERRUPTED")]
)
def test_a_running_runs_allocation_pending_in_accounting_is_asked_of_squeue(tmp_path, slurm, squeue, expected):
    """sacct lags behind a job's start (PENDING a moment after the allocation started its runs): squeue says whether
    it is really back in the queue."""
    records.write_plan(tmp_path, plan(0, "41", ["0", "1"]))
    events(tmp_path, 0, {"time": 10, "event": "began"}, {"time": 10, "event": "started", "run": "0"})
    slurm["states"], slurm["queue"] = {"41": "PENDING"}, ({"41": squeue} if squeue else {})
    found = status.read(tmp_path)
    assert (found.runs["0"].state, found.runs["1"].state, slurm["squeue"]) == (expected, "WAITING", 1)
