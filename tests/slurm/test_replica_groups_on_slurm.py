"""Replica groups on the Slurm test cluster: a node of one group set DOWN mid-run takes down only that group's job
step; the agent starts the group again on the spare node, the other groups train on, and it rejoins from them.
Every job here is followed to its end by ``launcher.wait=true``, whose closing lines and exit code say how it ended
(the groups' steps write no result file of submitit's: the follower reads Slurm's state and the run's records)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Dict, List

import pytest

from tests.slurm.test_requeue_slurm import SLURM, wait_until_finished_with_summary
from tests.support.cli import read_summary, wait_for
from tests.support.paths import REPO

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
HOLD = 13  # the node-down test's step: the groups hold before it (HPC_TRAIN_HOLD_AT) and the test sets a node down
DIGEST = re.compile(r"replica group (\d+) step (\d+) parameter digest (\w+)")


def train_steps(run_dir: Path) -> int:
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return 0
    return sum(1 for line in path.read_text().splitlines() if '"kind": "train"' in line)


def follow(args: List[str], run_dir: Path, out: Path, **env: str) -> subprocess.Popen:
    """`hpc-train ... launcher.wait=true` in the background, everything it prints into `out`."""
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    return subprocess.Popen(
        [sys.executable, "-m", "hpc_train.cli", *SLURM, *args, "launcher.wait=true", f"hydra.run.dir={run_dir}"],
        cwd=REPO,
        env=dict(os.environ, CUDA_VISIBLE_DEVICES="", **env),
        stdout=out.open("w"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def submitted(out: Path) -> str:
    wait_for(lambda: re.search(r"submitted Slurm job (\d+)", out.read_text()), 60, "the job queued")
    return re.search(r"submitted Slurm job (\d+)", out.read_text()).group(1)


def followed_to_its_end(proc: subprocess.Popen, out: Path, steps: int, timeout: float = 300) -> str:
    """The follower's exit code 0 and its closing lines: the steps trained, the groups, where the records are."""
    proc.wait(timeout=timeout)
    said = out.read_text()
    lines = said.strip().splitlines()
    assert proc.returncode == 0, said
    assert not re.search(r"job \d+ failed|the job failed|result\.pkl|requeued", said), said
    done = next(line for line in lines if line.startswith("hpc-train: done:"))
    assert done.startswith(f"hpc-train: done: {steps} steps,") and "replica groups" in done, said
    assert lines[-1].startswith("hpc-train: logs"), said
    return said


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
    run_dir, out = tmp_path / "run", tmp_path / "hpc-train.out"
    proc = follow(
        RUN,
        run_dir,
        out,
        # Every step at full speed. The groups hold before step HOLD until group 1 has been restarted (the test sets
        # its node down there), and from then on the others take a step only with it back or asking for its quorum
        HPC_TRAIN_HOLD_AT=str(HOLD),
        HPC_TRAIN_REPLICA_DIGESTS="1",
        HPC_TRAIN_RESTART_SLEEP="10",  # the restarted group starts slowly: the others train without it first
    )
    job = submitted(out)
    wait_for(lambda: train_steps(run_dir) >= HOLD - 1, 180, f"{HOLD - 1} training steps")
    placed = {g: n for g, n in re.findall(r"replica group (\d) on (\S+)", _agent_log(run_dir, job))}
    down = placed["1"]
    subprocess.run(["scontrol", "update", f"nodename={down}", "state=down", "reason=replica-groups-test"], check=True)
    try:
        fields = wait_until_finished_with_summary(job, run_dir, timeout=300)
    finally:  # back to service, whatever happened (the cluster may have done it already)
        subprocess.run(["scontrol", "update", f"nodename={down}", "state=resume"], capture_output=True)
    assert fields["Restarts"] == "0", fields  # the job itself was never requeued
    followed_to_its_end(proc, out, 60)  # launcher.wait says it completed, as Slurm does

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
    assert events == [("failed", 1), ("dropped", 1), ("restarted", 1), ("rejoined", 1)], events
    step = {r["event"]: r["step"] for r in rows if r["kind"] == "replica"}
    dropped, rejoined = step["dropped"], step["rejoined"]
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


@pytest.mark.slurm
@pytest.mark.parametrize(
    "ranks, kill",
    [(1, None), (2, None), (1, "1:8")],
    ids=["groups of one rank", "groups of two ranks", "groups of one rank, one killed"],
)
def test_launcher_wait_follows_a_replica_group_job_to_its_completion(slurm_cluster, tmp_path, ranks, kill):
    """2 groups on 2 nodes and a spare, followed by launcher.wait: exit code 0 and the closing lines of a completed
    run, as Slurm and the run's records say; a group's rank SIGKILLed restarts that group on the spare node first."""
    run_dir, out = tmp_path / "run", tmp_path / "hpc-train.out"
    args = [
        "model=toy_mlp", "data=synthetic", "strategy=ddp", "resources.nodes=2", f"resources.gpus_per_node={ranks}",
        "fault_tolerance.replica_groups=2", "fault_tolerance.timeout_s=6", "trainer.max_steps=40",
        "trainer.checkpoint_every=0", "trainer.eval=false",
    ]  # fmt: skip
    # The killed group is back before the other finishes: from 2 steps after the kill the other waits for it to ask
    # for its quorum before a step (HPC_TRAIN_HOLD_AT), however long its restart on the spare node takes
    hold = str(int(kill.partition(":")[2]) + 2) if kill else ""
    env: Dict[str, str] = {"HPC_TRAIN_KILL_AT": kill, "HPC_TRAIN_HOLD_AT": hold} if kill else {}
    proc = follow(args, run_dir, out, **env)
    job = submitted(out)
    followed_to_its_end(proc, out, 40)
    assert subprocess.run(
        ["sacct", "-n", "-X", "-P", "-j", job, "-o", "State"], capture_output=True, text=True
    ).stdout.split() == ["COMPLETED"]
    agent = _agent_log(run_dir, job)
    assert agent.count("replica group 1 on") == (2 if kill else 1), agent
    if kill:  # a kill -9: Slurm's accounting records the step FAILED, not OUT_OF_MEMORY; the usual cause, not a fact
        assert "usually the kernel's out-of-memory killer" in agent and "as OUT_OF_MEMORY" not in agent, agent
    assert read_summary(run_dir)["global_step"] == 40
    # Every group's step ended COMPLETED in Slurm's record (the killed group's first aside) with no traceback in its
    # logs: no step shares a file of submitit's with another (a group's step writes no result file at all)
    states = [state.split()[0] for _, _, state in job_steps(job)]
    assert len(states) == (3 if kill else 2) and states.count("COMPLETED") == len(states) - bool(kill), states
    slurm_dir = run_dir / "slurm"
    logs = {path.name: path.read_text() for path in slurm_dir.glob(f"{job}_*_log.*")}
    assert logs and not [name for name, text in logs.items() if "Traceback" in text], logs
    assert not list(slurm_dir.glob(f"{job}_*result.pkl*")), sorted(path.name for path in slurm_dir.iterdir())
