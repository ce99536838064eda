"""A replica group that hangs is named by its own watchdog, stopped and restarted alone; the other trains on."""

from __future__ import annotations

import json
import os
import re

from tests.support.cli import assert_ok, run_cli

HANGS = "trainer.step={_target_:tests.support.user_steps.sleeps_in_replica_group_1,_partial_:true}"
RUN = [
    "model=toy_mlp",
    "data=synthetic",
    "resources.gpus_per_node=4",
    "trainer.batch_size=48",
    "trainer.max_steps=30",
    "trainer.eval=false",
    "fault_tolerance.replica_groups=2",
    "fault_tolerance.timeout_s=6",
    "trainer.hang_timeout_s=10",  # the group's own watchdog; the groups waiting for a quorum are not "hung"
    HANGS,
]


def test_a_hung_group_is_named_restarted_alone_and_rejoins(tmp_path):
    run_dir = tmp_path / "run"
    # Group 1 hangs in step 8; from step 10 group 0 waits for the restarted group to ask for its quorum before a step
    # (HPC_TRAIN_HOLD_AT): it is back before group 0 finishes, however long the hang's detection and its restart take
    env = {"HPC_TRAIN_HOLD_AT": "10", "HPC_TRAIN_REPLICA_DIGESTS": "1"}
    proc = run_cli(RUN, run_dir, env=dict(os.environ, **env), timeout=240)
    assert_ok(proc)
    out = proc.stderr + proc.stdout
    # The group's watchdog names the sleeping rank (rank 1 of group 1: rank 3 of the job), and only that group stops
    assert re.search(r"replica group 1: hang: no rank advanced for 10 s .*\n.*rank 3", out), out
    assert "replica group 1: hung" in out and "restarting group 1 (1 of at most 3)" in out, out
    assert "restarting group 0" not in out, out
    hang_record = json.loads((run_dir / "logs" / "hang.json").read_text())
    assert hang_record["group"] == 1 and hang_record["culprits"] == [3], hang_record
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    failed = [row for row in rows if row.get("kind") == "replica" and row["event"] == "failed"]
    assert [(row["group"], row["who"], row["cause"]) for row in failed] == [(1, "rank 3", "hung")], failed
    for rank in (0, 1):  # the other group's ranks started once and never stopped
        assert "restarted, rejoining" not in (run_dir / "logs" / f"rank{rank}.log").read_text()
    attempts = [json.loads(line) for line in (run_dir / "attempts.jsonl").read_text().splitlines()]
    assert [(a["event"], a.get("how")) for a in attempts] == [("start", None), ("end", "finish")], attempts
    finals = {
        re.search(r"final parameter digest (\w+)", (run_dir / "logs" / f"rank{rank}.log").read_text()).group(1)
        for rank in (0, 2)
    }
    assert len(finals) == 1, finals
