"""fault_tolerance.replica_groups with real gloo ranks on the CPU, ddp and fsdp: 3 replica groups of 2 ranks train as
one job of 6 ranks does, lose a group to SIGKILL and train on without it, take it back from a live group's memory,
and resume as a whole job from their checkpoint.

"As one job does" is within 1e-4 (every logged loss and the final checkpoint's parameters): the groups reduce inside a
group, then across the groups, which changes only the order of floating-point sums. The groups are bit-identical to
each other at every step they all take (the parameter digests of HPC_TRAIN_REPLICA_DIGESTS=1).

Runs are shared through module fixtures: a plain 6-rank ddp run and a 3 x 2 grouped ddp run of 20 steps (and the
grouped run resumed from its step-10 checkpoint); per strategy (ddp, fsdp) a grouped run of 30 steps whose group 1
loses a rank at step 20, whose first 20 steps (no failure yet) must also train as the plain run does.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Dict, List, Tuple

import pytest
import torch

from tests.support.cli import TINY, assert_ok, checkpoint_steps, read_summary, run_cli
from tests.support.paths import REPO

GROUPS, SIZE = 3, 2  # 3 replica groups of 2 ranks: global rank = group * SIZE + rank in the group
STEPS = 20
TIMEOUT_S = 6  # fault_tolerance.timeout_s (collectives); a group without a heartbeat is dropped after 5 s (default)
RANKS = [f"resources.gpus_per_node={GROUPS * SIZE}"]
JOB = [*TINY, *RANKS, "trainer.batch_size=48", "trainer.epochs=null", "trainer.eval=false"]
HALF = STEPS // 2
# Checkpoints at step HALF (the resume test starts from it) and at the end of training
TWENTY = [*JOB, f"trainer.max_steps={STEPS}", "trainer.log_every=1", f"trainer.checkpoint_every={HALF}"]
REPLICAS = [f"fault_tolerance.replica_groups={GROUPS}", f"fault_tolerance.timeout_s={TIMEOUT_S}"]
DIGESTS = {"HPC_TRAIN_REPLICA_DIGESTS": "1"}

# The failure: rank 1 of group 1 (global rank 3) SIGKILLs itself before step 21, in the group's first start only. The
# launcher restarts group 1 at once; the restarted group sleeps RESTART_SLEEP_S before it rejoins, longer than
# TIMEOUT_S, so that the lighthouse drops it first. Every step runs at full speed; the live groups train on without it
# up to step HOLD, where they wait for it to ask for its quorum again (HPC_TRAIN_HOLD_AT): it must come back while
# they train (one that comes back after they finished is not healed: hpc_train today trains it alone from its first
# step, over the run's records), and the hold makes that so however long its start-up takes.
KILLED_RANK, KILL_STEP, LONG = 3, 20, 30
HOLD = KILL_STEP + 5
RESTART_SLEEP_S = 10
FAILURE = {
    "HPC_TRAIN_KILL_AT": f"{KILLED_RANK}:{KILL_STEP}",
    "HPC_TRAIN_RESTART_SLEEP": str(RESTART_SLEEP_S),
    "HPC_TRAIN_HOLD_AT": str(HOLD),
}
HELD = re.compile(r"replica group \d+: held (\d+\.\d) s before step (\d+)")  # a rank's note of a hold over 0.5 s
# A live group waits for the dead one at most TIMEOUT_S (the lighthouse's heartbeat timeout) plus this slack: the
# quorum's round trip (a heartbeat and a quorum tick of 0.1 s each), then the step itself (the compute of a toy MLP)
# on 2 cores shared with the restarted group's start-up. Measured: 6.8 s at most (with a 0.5 s sleep in each step).
GAP_SLACK_S = 4.0
# From the kill (group 1's last step before it) to group 1's first step back: its restart sleep, plus the launcher
# noticing the death (0.2 s polls), its 2 processes starting (torch, torchft, the strategy: ~3 s here) and the quorum
# that takes it back (at most TIMEOUT_S), with room for a loaded 2-core machine. Measured: 15 s (22 s loaded).
REJOIN_STARTUP_S = 30.0
REJOIN_BOUND_S = RESTART_SLEEP_S + TIMEOUT_S + REJOIN_STARTUP_S

START = re.compile(rf"\] INFO rank \d+/{SIZE} \(local ")  # a rank's first line, logged once per start
LOG_LINE = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) \[rank \d+\] \w+ (.*)$")
DIGEST = re.compile(r"replica group (\d+) step (\d+) parameter digest (\w+)")


@dataclass
class Run:
    dir: Path
    stdout: str


def run(args: List[str], run_dir: Path, env: Dict[str, str], timeout: float = 180) -> Run:
    proc = run_cli(args, run_dir, timeout=timeout, env=dict(os.environ, **env))
    assert_ok(proc)
    return Run(run_dir, proc.stdout)


def rows(run_dir: Path, kind: str) -> List[Dict]:
    found = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [row for row in found if row.get("kind") == kind]


def losses(run_dir: Path) -> Dict[int, float]:
    return {row["step"]: row["loss"] for row in rows(run_dir, "train")}  # the last row of a step wins (a resume)


def log(run_dir: Path, rank: int) -> str:
    return (run_dir / "logs" / f"rank{rank}.log").read_text()


def timed_lines(run_dir: Path, rank: int) -> List[Tuple[float, str]]:
    """(seconds since the epoch, message) of every line of a rank's log (its timestamps: this machine's local time)."""
    found = []
    for line in log(run_dir, rank).splitlines():
        match = LOG_LINE.match(line)
        if match:
            when = datetime.strptime(match.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
            found.append((when, match.group(2)))
    return found


def digests(run_dir: Path, group: int) -> List[Tuple[float, int, str]]:
    """(time, step, digest) of every step group `group` committed, from its rank 0's log, in order."""
    found = []
    for when, message in timed_lines(run_dir, group * SIZE):
        match = DIGEST.fullmatch(message)
        if match:
            assert int(match.group(1)) == group
            found.append((when, int(match.group(2)), match.group(3)))
    return found


def by_step(run_dir: Path, group: int) -> Dict[int, str]:
    return {step: digest for _, step, digest in digests(run_dir, group)}


def final_digest(run_dir: Path, group: int) -> str:
    finals = re.findall(r"final parameter digest (\w+)", log(run_dir, group * SIZE))
    assert finals, f"group {group} logged no final digest"
    return finals[-1]  # the last start's


def checkpoint_weights(run_dir: Path, step: int) -> Dict[str, torch.Tensor]:
    """The model's parameters in the checkpoint of `step`: ddp's single file, or fsdp's sharded DCP dir assembled as
    hpc-train-export does."""
    single = run_dir / "checkpoints" / f"step_{step:09d}.ckpt"
    if single.is_file():
        from hpc_train.compute.checkpointing.files import read_checkpoint

        shards = read_checkpoint(single)["shards"].values()
        return {name: tensor for shard in shards for name, tensor in shard["model"].items()}
    from hpc_train.compute.checkpointing.dcp_consolidate import consolidate
    from hpc_train.compute.checkpointing.export import find_checkpoint

    return consolidate(find_checkpoint(run_dir, step), "model.")


def assert_close_weights(a: Dict[str, torch.Tensor], b: Dict[str, torch.Tensor], tol: float = 1e-4) -> None:
    assert a.keys() == b.keys() and a
    worst = max((a[k].float() - b[k].float()).abs().max().item() for k in a)
    assert worst <= tol, f"parameters differ by {worst:.2e}"


# -- the runs, once per strategy -------------------------------------------------------------------------------------
@pytest.fixture(scope="module", params=["ddp", "fsdp"])
def strategy(request) -> str:
    return request.param


@pytest.fixture(scope="module")
def plain(tmp_path_factory) -> Run:
    """Plain data parallelism over the 6 ranks: the reference of the grouped runs, ddp and fsdp alike."""
    return run([*TWENTY, "strategy=ddp"], tmp_path_factory.mktemp("plain"), {})


@pytest.fixture(scope="module")
def grouped(tmp_path_factory) -> Run:
    return run([*TWENTY, *REPLICAS, "strategy=ddp"], tmp_path_factory.mktemp("grouped"), DIGESTS)


@pytest.fixture(scope="module")
def failed(strategy, tmp_path_factory) -> Run:
    # a row every step and a checkpoint at the kill's step: its first KILL_STEP steps are a run without a failure
    every = ["trainer.log_every=1", f"trainer.checkpoint_every={KILL_STEP}", f"trainer.keep_checkpoints={LONG}"]
    args = [*JOB, *REPLICAS, *every, f"strategy={strategy}", f"trainer.max_steps={LONG}"]
    return run(args, tmp_path_factory.mktemp(f"failed-{strategy}"), {**DIGESTS, **FAILURE}, timeout=240)


# -- without a failure -----------------------------------------------------------------------------------------------
def test_three_groups_of_two_ranks_train_as_one_job_of_six_ranks(plain, grouped):
    ours, theirs = losses(grouped.dir), losses(plain.dir)
    assert sorted(ours) == list(range(1, STEPS + 1)) and ours.keys() == theirs.keys()
    assert [ours[step] for step in sorted(ours)] == pytest.approx([theirs[step] for step in sorted(ours)], abs=1e-4)
    assert_close_weights(checkpoint_weights(grouped.dir, STEPS), checkpoint_weights(plain.dir, STEPS))
    summary = read_summary(grouped.dir)
    assert summary["global_step"] == STEPS
    assert summary["replica_groups"] == GROUPS and summary["steps_with_fewer_groups"] == 0
    assert rows(grouped.dir, "replica") == []


def test_every_group_holds_the_same_parameters_at_every_step(grouped):
    steps = [by_step(grouped.dir, group) for group in range(GROUPS)]
    assert sorted(steps[0]) == list(range(1, STEPS + 1))
    assert all(other == steps[0] for other in steps[1:])
    assert len({final_digest(grouped.dir, group) for group in range(GROUPS)}) == 1


def test_the_closing_line_says_no_group_was_dropped(grouped):
    done = next(line for line in grouped.stdout.splitlines() if line.startswith("hpc-train: done:"))
    assert done.endswith(f"; {GROUPS} replica groups, none dropped")


# -- a group killed, dropped, restarted and back ----------------------------------------------------------------------
def test_before_the_kill_the_groups_train_as_one_job_of_six_ranks(failed, plain):
    """ddp and fsdp inside the groups: the steps before the failure equal plain 6-rank ddp within 1e-4 (every loss, and
    the parameters of the checkpoint at the kill's step)."""
    ours, theirs = losses(failed.dir), losses(plain.dir)
    before = list(range(1, KILL_STEP + 1))
    assert [ours[step] for step in before] == pytest.approx([theirs[step] for step in before], abs=1e-4)
    assert_close_weights(checkpoint_weights(failed.dir, KILL_STEP), checkpoint_weights(plain.dir, KILL_STEP))


def test_a_group_that_loses_a_rank_is_restarted_alone_and_the_run_succeeds(failed):
    summary, events = read_summary(failed.dir), rows(failed.dir, "replica")
    assert summary["global_step"] == LONG and summary["replica_groups"] == GROUPS, (summary["global_step"], events)
    for group in range(GROUPS):
        for rank in range(group * SIZE, (group + 1) * SIZE):
            text = log(failed.dir, rank)
            starts, rejoins = len(START.findall(text)), text.count("restarted, rejoining")
            assert (starts, rejoins) == ((2, 1) if group == 1 else (1, 0)), f"rank {rank}: {starts} starts"


def test_the_live_groups_never_wait_much_longer_than_the_timeout(failed):
    for group in (0, 2):
        found = digests(failed.dir, group)
        assert [step for _, step, _ in found] == list(range(1, LONG + 1))  # every step, none taken twice
        gaps = {later[1]: later[0] - earlier[0] for earlier, later in zip(found, found[1:])}
        for held, step in HELD.findall(log(failed.dir, group * SIZE)):
            gaps[int(step)] -= float(held)  # the test's own wait for group 1 (HPC_TRAIN_HOLD_AT), not the product's
        step, gap = max(gaps.items(), key=lambda item: item[1])
        assert gap <= TIMEOUT_S + GAP_SLACK_S, f"group {group} waited {gap:.1f} s before step {step}"


def test_the_dropped_group_is_back_within_its_restart_start_up_and_the_timeout(failed):
    found = digests(failed.dir, 1)
    steps = [step for _, step, _ in found]
    assert steps[:KILL_STEP] == list(range(1, KILL_STEP + 1))
    back = steps[KILL_STEP]  # the first step after the restart
    assert steps[KILL_STEP:] == list(range(back, LONG + 1))
    waited = found[KILL_STEP][0] - found[KILL_STEP - 1][0]  # from its last step before the kill
    assert RESTART_SLEEP_S <= waited <= REJOIN_BOUND_S, f"group 1 was back {waited:.1f} s after the kill"


def test_the_failure_restart_drop_and_rejoin_are_one_row_each_and_the_summary_counts_the_steps_between(failed):
    events = rows(failed.dir, "replica")
    kinds = [(row["event"], row["group"]) for row in events]
    assert kinds == [("failed", 1), ("dropped", 1), ("restarted", 1), ("rejoined", 1)], events
    failure, dropped, restarted, rejoined = events
    assert (failure["who"], failure["cause"], restarted["restart"]) == (f"rank {KILLED_RANK}", "SIGKILL", 1), events
    assert failure["step"] == restarted["step"] == dropped["step"] == KILL_STEP + 1 and dropped["groups"] == GROUPS - 1
    assert rejoined["step"] == digests(failed.dir, 1)[KILL_STEP][1] and rejoined["groups"] == GROUPS
    summary = read_summary(failed.dir)
    assert summary["steps_with_fewer_groups"] == rejoined["step"] - dropped["step"]
    assert (summary["replica_failures"], summary["replica_restarts"], summary["replica_rejoins"]) == (1, 1, 1), summary


def test_the_groups_hold_the_same_parameters_wherever_they_all_took_the_step_and_at_the_end(failed):
    steps = [by_step(failed.dir, group) for group in range(GROUPS)]
    assert steps[0] == steps[2]  # the live groups took every step together
    shared = set(steps[1]) & set(steps[0])
    assert len(shared) > KILL_STEP and all(steps[1][step] == steps[0][step] for step in shared)
    assert len({final_digest(failed.dir, group) for group in range(GROUPS)}) == 1


def test_the_closing_line_and_the_report_say_how_many_steps_ran_with_fewer_groups(failed):
    _, dropped, _, rejoined = rows(failed.dir, "replica")
    fewer, waited = rejoined["step"] - dropped["step"], read_summary(failed.dir)["replica_wait_s"]
    done = next(line for line in failed.stdout.splitlines() if line.startswith("hpc-train: done:"))
    assert done.endswith(
        f"; {GROUPS} replica groups: group 1 failed once (rank {KILLED_RANK}, SIGKILL) and rejoined at step"
        f" {rejoined['step']}; {fewer} step(s) with fewer groups; the others waited {waited:.1f} s"
    ), done
    code = (
        "import sys; from hpc_train.report.command import main; code = main([sys.argv[1], '--no-png']);"
        " assert 'torch' not in sys.modules, 'the report imported torch'; sys.exit(code)"
    )
    proc = subprocess.run([sys.executable, "-c", code, str(failed.dir)], capture_output=True, text=True, cwd=REPO)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    line = (
        f"replica groups: {GROUPS}; {fewer} step(s) with fewer groups; the others waited {waited:.1f} s;"
        f" group 1 failed at step {dropped['step']} (rank {KILLED_RANK}, SIGKILL), dropped at step {dropped['step']},"
        f" restarted at step {dropped['step']}, rejoined at step {rejoined['step']}"
    )
    assert line in proc.stdout.splitlines()


# -- a whole-job resume ----------------------------------------------------------------------------------------------
def test_a_job_of_groups_stopped_after_a_checkpoint_and_run_again_resumes_exactly(grouped, tmp_path):
    """The grouped run as a job stopped after its checkpoint of step HALF would have left it (what it wrote after that
    step removed: the rows stay, as a kill leaves them), run again: every group resumes from the checkpoint the leading
    group wrote, and the job ends with the uninterrupted run's weights bit for bit. (A copy, not a kill -9 of a live
    job: one start of 6 ranks less, for this module's time; tests/e2e/test_fsdp.py kills jobs.) The leading group's
    single-file ddp checkpoint; fsdp's sharded one is read back by the fsdp failure run's comparison at its kill."""
    run_dir = tmp_path / "run"
    shutil.copytree(grouped.dir, run_dir)
    assert checkpoint_steps(run_dir) == [HALF, STEPS]
    for path in [*run_dir.glob(f"checkpoints/step_{STEPS:09d}*"), run_dir / "summary.json", run_dir / "model.pt"]:
        shutil.rmtree(path) if path.is_dir() else path.unlink()
    run([*TWENTY, *REPLICAS, "strategy=ddp"], run_dir, {})
    summary = read_summary(run_dir)
    assert summary["resumed_from_step"] == HALF and summary["global_step"] == STEPS
    assert summary["steps_with_fewer_groups"] == 0
    assert len({final_digest(run_dir, group) for group in range(GROUPS)}) == 1
    assert final_digest(run_dir, 0) == final_digest(grouped.dir, 0)  # the uninterrupted run's weights, bit for bit
    ours, theirs = losses(run_dir), losses(grouped.dir)
    assert [ours[step] for step in range(HALF + 1, STEPS + 1)] == [theirs[s] for s in range(HALF + 1, STEPS + 1)]
    assert torch.equal(*(checkpoint_weights(d, STEPS)["1.weight"] for d in (run_dir, grouped.dir)))
