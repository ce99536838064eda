"""A replica group that dies while the attempt starts (before it is ready) is restarted, and the attempt's groups still
start together: nothing waits forever for the dead group, and no group trains alone meanwhile.

The groups here are of one rank each (2 groups x 1 rank), whose group has no process group of its own: its store
for torchft comes from hpc_train (hpc_train.compute.replicas.group).
"""

from __future__ import annotations

import json
import os
import re
from typing import Dict

from tests.support.cli import TINY, assert_ok, run_cli

STEPS = 10
RUN = [
    *TINY,
    "resources.gpus_per_node=2",
    "trainer.epochs=null",
    f"trainer.max_steps={STEPS}",
    "trainer.eval=false",
    "fault_tolerance.replica_groups=2",
    "fault_tolerance.timeout_s=5",
]
DIGEST = re.compile(r"replica group (\d) step (\d+) parameter digest (\w+)")


def step_digests(log: str) -> Dict[int, str]:
    return {int(step): digest for _, step, digest in DIGEST.findall(log)}


def test_a_group_that_dies_in_start_up_is_restarted_and_the_groups_start_together(tmp_path):
    run_dir = tmp_path / "run"
    env = {"HPC_TRAIN_KILL_AT": "1:start", "HPC_TRAIN_REPLICA_DIGESTS": "1"}  # group 1's only rank, before it is ready
    proc = run_cli(RUN, run_dir, env=dict(os.environ, **env), timeout=180)
    assert_ok(proc)
    out = proc.stderr + proc.stdout
    assert "replica group 1: rank 1 was killed by SIGKILL" in out and "restarting group 1 (1 of at most 3)" in out, out
    logs = [(run_dir / "logs" / f"rank{rank}.log").read_text() for rank in (0, 1)]
    assert "restarted, rejoining" in logs[1] and "restarted, rejoining" not in logs[0]
    # Both groups took every step, bit-identical: group 0 waited for the restarted group before its first step
    digests = [step_digests(log) for log in logs]
    assert sorted(digests[0]) == sorted(digests[1]) == list(range(1, STEPS + 1)), digests
    assert digests[0] == digests[1]
    # No group was dropped, but the failure is on record: it failed, was restarted and took step 1 with group 0
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    events = [(row["event"], row["group"], row["step"]) for row in rows if row.get("kind") == "replica"]
    assert events == [("failed", 1, 1), ("restarted", 1, 1), ("rejoined", 1, 1)], events
    [done] = [line for line in out.splitlines() if line.startswith("hpc-train: done:")]
    assert "; 2 replica groups: group 1 failed once (rank 1, SIGKILL) and rejoined at step 1; the others" in done, done
