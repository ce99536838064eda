"""The trackers hold the same rows as metrics.jsonl when the group that opened them (group 0) is the one that fails:
TensorBoard and MLflow get the failure, the restart and the return, and every training row group 1 wrote while group
0 was out, from the restarted group 0 (which continues the same MLflow run, not a new one).

2 groups of 1 rank, a toy MLP: group 0's only rank (rank 0) SIGKILLs itself before step KILL + 1; its restart sleeps
longer than the heartbeat timeout (5 s), so group 1 drops it, leads and writes the rows of the next steps alone, until
group 0 is back (HPC_TRAIN_HOLD_AT makes group 1 wait for it from step HOLD, however long its start-up takes).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Dict, List, Tuple

import pytest

from tests.e2e.test_tensorboard import scalars
from tests.e2e.test_trackers import history, mlflow_client
from tests.support.cli import TINY, assert_ok, run_cli

STEPS, KILL = 14, 5
RUN = [
    *TINY,
    "resources.gpus_per_node=2",
    "trainer.epochs=null",
    f"trainer.max_steps={STEPS}",
    "trainer.eval=false",
    "trainer.log_every=1",
    "trainer.checkpoint_every=0",
    "fault_tolerance.replica_groups=2",
    "logger=[tensorboard,mlflow]",
]
HOLD = KILL + 3
ENV = {"HPC_TRAIN_KILL_AT": f"0:{KILL}", "HPC_TRAIN_RESTART_SLEEP": "8", "HPC_TRAIN_HOLD_AT": str(HOLD)}


@pytest.fixture(scope="module")
def group0_killed(tmp_path_factory) -> Tuple[Path, List[Dict]]:
    run_dir = tmp_path_factory.mktemp("group0") / "run"
    proc = run_cli(RUN, run_dir, env=dict(os.environ, **ENV), timeout=240)
    assert_ok(proc)
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return run_dir, rows


def test_tensorboard_holds_every_row_of_metrics_jsonl_when_group_0_failed(group0_killed):
    run_dir, rows = group0_killed
    replica = [row for row in rows if row["kind"] == "replica"]
    events = [row["event"] for row in replica if row["group"] == 0]
    assert events[0] in ("failed", "dropped") and "restarted" in events and events[-1] == "rejoined", events
    # group 1 led while group 0 was out: it wrote the rows of the steps before group 0's return (the test's premise)
    (drop,) = [row["step"] for row in replica if row["group"] == 0 and row["event"] == "dropped"]
    (back,) = [row["step"] for row in replica if row["group"] == 0 and row["event"] == "rejoined"]
    assert drop <= HOLD <= back, (drop, back)
    found = scalars(run_dir / "tensorboard")
    # each replica row as replica/<event> = the group, at its step; replica/groups: how many groups train on
    for row in replica:
        assert (row["step"], float(row["group"])) in found[f"replica/{row['event']}"], (row, found)
    # every training row, those group 1 wrote while group 0 was out included, once, with metrics.jsonl's numbers
    train = [(row["step"], pytest.approx(row["loss"])) for row in rows if row["kind"] == "train"]
    assert [s for s, _ in train] == list(range(1, STEPS + 1))
    assert found["train/loss"] == train


def test_mlflow_continues_its_run_and_holds_the_rows_when_group_0_failed(group0_killed):
    run_dir, rows = group0_killed
    client, run_id = mlflow_client(run_dir)
    (experiment,) = [e for e in client.search_experiments() if e.name != "Default"]
    assert [r.info.run_id for r in client.search_runs([experiment.experiment_id])] == [run_id]  # one run, not two
    train = [(row["step"], pytest.approx(row["loss"])) for row in rows if row["kind"] == "train"]
    assert history(client, run_id, "train_loss") == train
    for row in (row for row in rows if row["kind"] == "replica"):
        assert (row["step"], float(row["group"])) in history(client, run_id, f"replica_{row['event']}"), row
