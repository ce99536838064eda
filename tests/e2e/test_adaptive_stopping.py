"""hydra/sweeper=adaptive over a script job that cannot resume (no script.resume_args): ASHA's stopping form. Each
trial runs its full budget in one job; the controller reads the objective the script reports as it runs, and a trial
that ranks poorly when it reaches a rung's budget is stopped there, its job cancelled, and never started again.

tests/support/scripts/tuned_script.py: gradient descent on (w - 3)^2 from w = 0, its loss reported at every step;
one slot, so that the trials reach each rung in the order they were asked and ASHA's decisions are the same on every
run (seed 3 asks for a trial 2 worse at the first rung than trials 0 and 1)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from hpc_train.jobs.study import trial_rows
from tests.support.paths import REPO, SCRIPTS

TRIALS, RUNGS = 3, (1, 3, 9)  # min_resource 1, eta 3, max_resource 9


def _loss(lr: float, steps: int) -> float:
    return 9.0 * (1.0 - 2.0 * lr) ** (2 * steps)  # (w - 3)^2 after `steps` steps from w = 0


def test_a_script_that_cannot_resume_is_stopped_at_a_rung_mid_run_and_never_started_again(tmp_path):
    sweep_dir = tmp_path / "study"
    command = [sys.executable, "-m", "hpc_train.cli", "-m", "hydra/sweeper=adaptive", "strategy=single"]
    command += ["objective=train_loss", "+script.overrides.lr=interval(0.01,0.3)", "+script.overrides.sleep=0.5"]
    command += [f"+script.overrides.steps={RUNGS[-1]}", "hydra.sweeper.sampler=random", "hydra.sweeper.seed=3"]
    command += [f"hydra.sweeper.max_trials={TRIALS}", "hydra.sweeper.max_concurrent=1", "hydra.sweeper.poll_s=0.3"]
    command += ["hydra.sweeper.scheduler.resource_key=script.overrides.steps"]
    command += [f"hydra.sweeper.scheduler.max_resource={RUNGS[-1]}", f"hydra.sweep.dir={sweep_dir}"]
    done = subprocess.run(
        [*command, "--", str(SCRIPTS / "tuned_script.py")], cwd=REPO, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stdout + done.stderr
    rows = trial_rows(sweep_dir)
    assert [row["number"] for row in rows] == list(range(TRIALS))
    for row in rows:
        run_dir = sweep_dir / str(row["number"])
        # one job with the full budget, never paused at a rung nor started again
        assert (run_dir / "runs.txt").read_text() == f"{RUNGS[-1]}\n", row
        starts = [json.loads(line) for line in (run_dir / "attempts.jsonl").read_text().splitlines()]
        assert [entry["event"] for entry in starts].count("start") == 1, starts
        lr = row["params"]["+script.overrides.lr"]
        for rung, value in row["rung_values"].items():  # the value the script reported at the rung's budget
            assert value == pytest.approx(_loss(lr, RUNGS[rung]), rel=1e-9)
    assert [row["state"] for row in rows] == ["COMPLETE", "COMPLETE", "PRUNED"], rows
    stopped = rows[2]
    assert stopped["status"] == "stopped" and stopped["rung"] == 0 and list(stopped["rung_values"]) == [0], stopped
    assert stopped["rung_values"][0] > max(row["rung_values"][0] for row in rows[:2])  # the worst at rung 0
    metrics = (sweep_dir / "2" / "metrics.jsonl").read_text().splitlines()
    assert max(json.loads(line)["step"] for line in metrics) < RUNGS[-1], metrics  # stopped mid-run
    assert "hpc-train: trial 2 stopped at rung 0: job" in done.stdout + done.stderr
    assert [sorted(row["rung_values"]) for row in rows[:2]] == [[0, 1, 2], [0, 1, 2]]


def test_a_packed_study_of_a_script_that_cannot_resume_is_refused_before_anything_is_queued(tmp_path):
    """Packed trials pause and promote only: a script without script.resume_args would start over at each rung."""
    sweep_dir = tmp_path / "study"
    command = [sys.executable, "-m", "hpc_train.cli", "-m", "launcher=slurm", "cluster.cpus_per_gpu=1"]
    command += ["cluster.time=10", "strategy=single", "resources.gpus_per_node=1", "launcher.pack.allocations=1"]
    command += ["launcher.pack.gpus_per_node=2", "hydra/sweeper=adaptive", "objective=train_loss"]
    command += ["+script.overrides.lr=interval(0.01,0.3)", f"+script.overrides.steps={RUNGS[-1]}"]
    command += ["hydra.sweeper.scheduler.resource_key=script.overrides.steps"]
    command += [f"hydra.sweeper.scheduler.max_resource={RUNGS[-1]}", f"hydra.sweep.dir={sweep_dir}"]
    done = subprocess.run(
        [*command, "--", str(SCRIPTS / "tuned_script.py")], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    said = done.stdout + done.stderr
    assert done.returncode == 2, said
    assert "`script.resume_args`" in said and "Fix: set script.resume_args" in said, said
    assert not sweep_dir.exists()  # nothing queued, no journal
