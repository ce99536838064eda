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
    # what a tracker plots: which group, and how many groups train on, at the event's step (not the wall clock)
    assert dict(scalars(dropped)) == {"group": 1.0, "groups": 2.0}
