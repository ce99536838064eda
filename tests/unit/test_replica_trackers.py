"""A replica group's drop and rejoin rows reach the trackers as well as metrics.jsonl."""

from __future__ import annotations

import json

from hpc_train.compute.training.loggers import TrackingWriter
from hpc_train.compute.training.tracker_common import scalars
from hpc_train.records import replicas


class Recorder:
    def __init__(self):
        self.rows = []

    def write(self, record):
        self.rows.append(record)

    def flush(self):
        pass

    def close(self):
        pass


def test_drop_and_rejoin_rows_are_passed_on_to_every_tracker(tmp_path):
    tracker = Recorder()
    writer = TrackingWriter(tmp_path, True, [tracker])
    dropped = replicas.event_row(replicas.DROPPED, 1, 21, 1795926188.3, 2)
    writer.write(dropped)
    writer.write(replicas.event_row(replicas.REJOINED, 1, 43, 1795926196.0, 3))
    assert [row["event"] for row in tracker.rows] == ["dropped", "rejoined"]
    lines = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert lines[0] == {"kind": "replica", "event": "dropped", "group": 1, "step": 21, "s": 1795926188.3, "groups": 2}
    # what a tracker plots: which group, under the event's name, and how many groups train on, at the event's step
    # (not the wall clock); two events of one step (a failure and a restart) stay apart
    assert dict(scalars(dropped)) == {"dropped": 1.0, "groups": 2.0}
    restarted = replicas.event_row(replicas.RESTARTED, 0, 21, 1795926190.0, 1, restart=1)
    assert dict(scalars(restarted)) == {"restarted": 0.0, "groups": 1.0, "restart": 1.0}


def test_a_restarted_group_passes_its_trackers_the_attempts_rows_first(tmp_path):
    """A restarted group 0 (catch_up): before its first row, its trackers take the rows of the attempt that the
    group that led while it was out wrote to metrics.jsonl, in order, and each row once."""
    led = [
        {"kind": "train", "step": 6, "loss": 2.0},
        replicas.event_row(replicas.FAILED, 0, 7, 1795926188.3, 1, who="rank 0", cause="SIGKILL"),
        replicas.event_row(replicas.RESTARTED, 0, 7, 1795926188.4, 1, restart=1),
        {"kind": "train", "step": 7, "loss": 1.9},
    ]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in led))
    tracker = Recorder()
    writer = TrackingWriter(tmp_path, False, [tracker], catch_up=True)
    writer.write({"kind": "train", "step": 8, "loss": 1.0})  # not leading yet: nothing
    writer.enabled = True
    back = replicas.event_row(replicas.REJOINED, 0, 8, 1795926196.0, 2)
    writer.write(back)
    writer.write({"kind": "train", "step": 8, "loss": 1.8})
    assert tracker.rows == [*led, back, {"kind": "train", "step": 8, "loss": 1.8}]
