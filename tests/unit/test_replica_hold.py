"""HPC_TRAIN_HOLD_AT, the test facility that holds the live replica groups until a restarted one asks for its quorum
again (hpc_train.compute.runtime.faults, hpc_train.compute.training.replica_steps): when it waits, and for what.
The runs that use it: tests/e2e/test_replica_group_death.py and the other replica-group fault tests."""

from __future__ import annotations

from types import SimpleNamespace
from typing import List

from hpc_train.compute.runtime import faults
from hpc_train.compute.training import replica_steps
from hpc_train.compute.training.replica_steps import ReplicaLoop
from hpc_train.records import replicas


def test_the_hold_waits_from_the_step_named_on_until_the_condition_holds(monkeypatch):
    asked: List[int] = []

    def back() -> bool:
        asked.append(1)
        return len(asked) >= 3

    monkeypatch.setattr(faults, "HOLD_POLL_S", 0.0)
    monkeypatch.delenv(faults.HOLD_VARIABLE, raising=False)
    assert faults.hold(9, back) == 0.0 and asked == []  # unset: no hold
    monkeypatch.setenv(faults.HOLD_VARIABLE, "8")
    assert faults.hold(7, back) == 0.0 and asked == []  # before the step named
    faults.hold(8, back)
    assert len(asked) == 3  # asked again until it held
    faults.hold(12, back)
    assert len(asked) == 4  # later steps too: it holds at once now


def steps(members: set, ranks: int = 2) -> ReplicaLoop:
    """A ReplicaLoop of 3 groups of `ranks` ranks whose last step was taken by `members` (no trainer, no torchft)."""
    held = ReplicaLoop.__new__(ReplicaLoop)
    held.trainer = SimpleNamespace(ranks=SimpleNamespace(world_size=ranks))
    held.group = SimpleNamespace(groups=3, members=members)
    held._asked = {}
    return held


def test_the_live_groups_go_on_once_a_group_was_restarted_and_every_rank_of_an_absent_group_asks(tmp_path, monkeypatch):
    monkeypatch.setattr(replica_steps, "HOLD_SETTLE_S", 0.0)
    assert not steps({0, 1, 2})._all_back(tmp_path)  # no restart yet: the fault is still to come
    replicas.append_event(tmp_path, replicas.FAILED, 1, 1.0, who="rank 3", cause="SIGKILL", restart=0)
    replicas.append_event(tmp_path, replicas.RESTARTED, 1, 2.0, restart=1)
    assert steps({0, 1, 2})._all_back(tmp_path)  # restarted and back in the last step already
    away = steps({0, 2})
    assert not away._all_back(tmp_path)  # group 1 restarted, not asking yet
    replicas.asking_file(tmp_path, 1, 0).write_text("1")
    assert not away._all_back(tmp_path)  # its rank 1 not yet
    replicas.asking_file(tmp_path, 1, 1).write_text("1")
    assert away._all_back(tmp_path)
    replicas.append_event(tmp_path, replicas.RESTARTED, 1, 3.0, restart=2)  # it failed again: its second restart
    assert not away._all_back(tmp_path)  # the first restart's ranks asked, not the second's
    assert not steps({0, 1})._all_back(tmp_path)  # group 2 away, never restarted: it must come back from one


def test_an_absent_group_that_asks_is_given_time_for_its_request_to_reach_the_lighthouse(tmp_path, monkeypatch):
    clock = [100.0]
    monkeypatch.setattr(replica_steps.time, "monotonic", lambda: clock[0])
    replicas.append_event(tmp_path, replicas.RESTARTED, 1, 2.0, restart=1)
    for rank in (0, 1):
        replicas.asking_file(tmp_path, 1, rank).write_text("1")
    away = steps({0, 2})
    assert not away._all_back(tmp_path)  # seen asking just now
    clock[0] += replica_steps.HOLD_SETTLE_S / 2
    assert not away._all_back(tmp_path)
    clock[0] += replica_steps.HOLD_SETTLE_S / 2
    assert away._all_back(tmp_path)
