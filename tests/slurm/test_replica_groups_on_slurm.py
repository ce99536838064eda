"""Replica groups on the Slurm test cluster: a node of one group set DOWN mid-run takes down only that group's job
step; the agent starts the group again on the spare node, the other groups train on, and it rejoins from them."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import List

import pytest

from tests.slurm.test_requeue_slurm import submit, wait_until_finished_with_summary
from tests.support.cli import read_summary, wait_for

GROUPS = ["fault_tolerance.replica_groups=3", "fault_tolerance.timeout_s=6", "fault_tolerance.spare_nodes=1"]
RUN = [
    "model=toy_mlp",
    "data=synthetic",
    "resources.nodes=3",
    "resources.gpus_per_node=2",  # 2 ranks a node: 3 groups x 2 ranks, one node each, and the spare
    "trainer.batch_size=48",
    "trainer.max_steps=60",
    "trainer.eval=false",
    "trainer.log_every=1",
    *GROUPS,
]
DIGEST = re.compile(r"replica group (\d+) step (\d+) parameter digest (\w+)")


def train_steps(run_dir: Path) -> int:
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return 0
    return sum(1 for line in path.read_text().splitlines() if '"kind": "train"' in line)


def job_steps(job: str) -> List[List[str]]:
    """sacct's rows of the job's steps: [step id, node list, state]."""
    out = subprocess.run(
        ["sacct", "-j", job, "-n", "-P", "-o", "JobID,NodeList,State"], capture_output=True, text=True
    ).stdout
    return [line.split("|") for line in out.splitlines() if re.match(rf"{job}\.\d+\|", line)]


@pytest.mark.slurm
def test_a_node_down_takes_down_only_its_group_which_restarts_on_the_spare_and_rejoins(slurm_cluster, tmp_path):
    nodes = subprocess.run(["sinfo", "-h", "-N", "-p", "debug", "-o", "%N"], capture_output=True, text=True).stdout
    if len(set(nodes.split())) < 4:
        pytest.fail("this test needs the suite's Slurm cluster of 4 nodes or more (3 groups and a spare)")
    run_dir = tmp_path / "run"
    job = submit(
        RUN,
        run_dir,
        HPC_TRAIN_STEP_SLEEP="0.4",
        HPC_TRAIN_REPLICA_DIGESTS="1",
        HPC_TRAIN_RESTART_SLEEP="10",  # the restarted group starts slowly: the others train without it first
    )
    wait_for(lambda: train_steps(run_dir) >= 12, 180, "12 training steps")
    placed = {g: n for g, n in re.findall(r"replica group (\d) on (\S+)", _agent_log(run_dir, job))}
    down = placed["1"]
    subprocess.run(["scontrol", "update", f"nodename={down}", "state=down", "reason=replica-groups-test"], check=True)
    try:
        fields = wait_until_finished_with_summary(job, run_dir, timeout=300)
    finally:  # back to service, whatever happened (the cluster may have done it already)
        subprocess.run(["scontrol", "update", f"nodename={down}", "state=resume"], capture_output=True)
    assert fields["Restarts"] == "0", fields  # the job itself was never requeued

    agent = _agent_log(run_dir, job)
    restarted_on = re.findall(r"replica group 1 on (\S+)", agent)
    assert restarted_on[0] == down and len(restarted_on) == 2 and restarted_on[1] not in placed.values(), agent
    assert agent.count("replica group 0 on") == 1 and agent.count("replica group 2 on") == 1, agent
    # Slurm's own record: one step for groups 0 and 2 each on their node, and group 1's twice, the second on the spare
    steps = job_steps(job)
    on = [nodelist for _, nodelist, _ in steps]
    assert on.count(placed["0"]) == 1 and on.count(placed["2"]) == 1 and on.count(down) == 1, steps
    assert on.count(restarted_on[1]) == 1, steps

    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    events = [(r["event"], r["group"]) for r in rows if r["kind"] == "replica"]
    assert events == [("dropped", 1), ("rejoined", 1)], events
    dropped, rejoined = (r["step"] for r in rows if r["kind"] == "replica")
    summary = read_summary(run_dir)
    assert summary["global_step"] == 60 and summary["steps_with_fewer_groups"] == rejoined - dropped > 0, summary
    trained = sorted(r["step"] for r in rows if r["kind"] == "train")
    assert trained == list(range(1, 61)), trained  # the live groups never stopped the run

    # Every group's parameters equal at every step they all took, and at the end
    digests = {}
    for log in sorted((run_dir / "logs").glob("rank*.log")):
        for group, step, digest in DIGEST.findall(log.read_text()):
            digests.setdefault(int(step), {}).setdefault(int(group), set()).add(digest)
    for step, by_group in digests.items():
        assert len(set().union(*by_group.values())) == 1, (step, by_group)
    assert set(digests[60]) == {0, 1, 2}
    finals = {
        m.group(1)
        for rank in (0, 2, 4)
        for m in [re.search(r"final parameter digest (\w+)", (run_dir / "logs" / f"rank{rank}.log").read_text())]
    }
    assert len(finals) == 1, finals


def _agent_log(run_dir: Path, job: str) -> str:
    """The batch host's words (the agent writes to the batch step's error log)."""
    return "".join(path.read_text() for path in sorted((run_dir / "slurm").glob(f"{job}_0_log.err")))
