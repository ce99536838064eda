"""An adaptive study on the real Slurm test cluster, each rung a Slurm job, its controller killed mid-study and
started again: every trial once, no slot left idle past a poll while trials remained, a promoted trial equal to an
uninterrupted run, and the trials that diverge on purpose failed while the study goes on: 16 trials of ASHA in 4 slots
(about 3.5 minutes on an idle machine), in the scale tier. The slot measure needs an idle machine: in the default
suite, beside the e2e tier, one submission (a child hpc-train) took up to 15 s and gaps reached 36 s. The default
suite sweeps on this machine (tests/e2e/test_adaptive_sweep.py)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

import pytest

from hpc_train.jobs.study import trial_rows
from tests.support.cli import TINY, assert_ok, run_cli
from tests.support.paths import REPO

pytestmark = [pytest.mark.scale, pytest.mark.slurm]

RUNGS, POLL_S = (1, 3, 9), 0.5
DIVERGES = 1e30  # a learning rate whose loss is NaN after one step: the trial fails (its objective is no number)
# The slot a rung freed goes to the next rung at the controller's next look: the rung's job is seen to end by
# squeue/sacct, then the next rung is submitted (sbatch, about 0.3 s each, one after another). Measured from the end
# Slurm records for the job (sacct's End, to the second) to the next submission: at most 2.6 s over three studies on
# the 4-node test cluster; the bound leaves twice that, and the second sacct rounds off. Measured from the rank's own
# end record instead, the gap also holds the ranks' exit and srun's teardown, which took 2.5 s on the idle machine
# and 7 to 9.5 s with the study's 16 ranks on 2 cores (gaps to 12.7 s): Slurm's time, not the controller's.
IDLE_BOUND_S = POLL_S + 6.0
# (trials, slots, learning rates): grid points are lr x momentum (3 momenta); the chosen trials leave out fewer
# points than diverge (3 per diverging lr), so at least one trial diverges
FULL = (16, 4, "0.02,0.05,0.1,0.2,0.3,1e30")  # 18 points, 16 trials


def _study_overrides(trials: int, slots: int, rates: str):
    return [
        "launcher=slurm",
        "cluster.cpus_per_gpu=1",
        "cluster.time=10",
        *TINY,
        "trainer.batch_size=32",
        "trainer.checkpoint_every=0",
        "hydra/sweeper=adaptive",
        f"trainer.lr=choice({rates})",
        "trainer.momentum=choice(0,0.5,0.9)",
        "hydra.sweeper.sampler=grid",
        "hydra.sweeper.seed=5",
        f"hydra.sweeper.max_trials={trials}",
        f"hydra.sweeper.max_concurrent={slots}",
        "hydra.sweeper.max_failures=3",
        f"hydra.sweeper.scheduler.max_resource={RUNGS[-1]}",
        f"hydra.sweeper.poll_s={POLL_S}",
    ]


def _command(sweep_dir: Path, size):
    return [sys.executable, "-m", "hpc_train.cli", "-m", *_study_overrides(*size), f"hydra.sweep.dir={sweep_dir}"]


def _finished_rungs(sweep_dir: Path) -> int:
    try:
        return sum(len(row["rung_values"]) for row in trial_rows(sweep_dir) or [])
    except Exception:  # the journal's first lines are being written
        return 0


@pytest.fixture(scope="module", params=[FULL], ids=["16"])
def study(request, tmp_path_factory):
    """The controller SIGKILLed once `slots` rungs have finished, then the same command to the end."""
    size = request.param
    sweep_dir = tmp_path_factory.mktemp("slurm_study")
    first = subprocess.Popen(_command(sweep_dir, size), cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 300
    while _finished_rungs(sweep_dir) < size[1] and first.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    assert first.poll() is None, first.communicate()[0].decode()[-3000:]
    first.send_signal(signal.SIGKILL)
    first.wait()
    killed_at = trial_rows(sweep_dir)
    away = (time.time(), time.time())  # the study had no controller from the kill to the next one's first look
    again = subprocess.run(_command(sweep_dir, size), cwd=REPO, capture_output=True, text=True, timeout=900)
    assert_ok(again)
    looked = min(t[0] for row in trial_rows(sweep_dir) for t in row["rung_times"].values() if t[0] > away[1])
    return sweep_dir, killed_at, again, size[0], (away[0], looked)


def _attempts(run_dir: Path):
    lines = (run_dir / "attempts.jsonl").read_text().splitlines() if (run_dir / "attempts.jsonl").exists() else []
    return [json.loads(line) for line in lines]


def test_every_trial_is_in_the_journal_once_and_each_rung_ran_once_on_slurm(study):
    sweep_dir, killed_at, _, trials, _ = study
    rows = trial_rows(sweep_dir)
    assert [row["number"] for row in rows] == list(range(trials))
    assert any(row["status"] == "running" for row in killed_at), killed_at
    for row in rows:
        starts = [entry for entry in _attempts(sweep_dir / str(row["number"])) if entry["event"] == "start"]
        if row["status"] == "failed":
            assert len(starts) == 1, (row, starts)  # its first rung, once
            continue
        assert row["state"] in ("COMPLETE", "PRUNED"), row
        assert len(starts) == len(row["rung_values"]), (row, starts)
        assert [entry["resumed_from_step"] for entry in starts] == [None, *RUNGS[: len(starts) - 1]]
        assert all(entry["job_id"] for entry in starts)  # each a Slurm job's attempt


def test_the_trials_that_diverge_fail_with_their_cause_and_the_study_goes_on(study):
    sweep_dir, _, again, _, _ = study
    rows = trial_rows(sweep_dir)
    failed = [row for row in rows if row["status"] == "failed"]
    assert failed and all(row["params"]["trainer.lr"] == DIVERGES for row in failed), failed
    assert all("eval_loss=nan: the run diverged" in row["error"] for row in failed), failed
    assert len([row for row in rows if row["params"]["trainer.lr"] != DIVERGES and row["state"] == "FAIL"]) == 0
    assert "hpc-train: study done: best trial" in again.stdout


def _slurm_end(job_id: str) -> float:
    """When Slurm recorded the job's end (sacct's End, to the second): when its slot was free."""
    out = subprocess.run(["sacct", "-n", "-X", "-P", "-j", job_id, "-o", "End"], capture_output=True, text=True)
    return datetime.fromisoformat(out.stdout.strip()).timestamp()


def _rung_jobs(run_dir: Path):
    """The Slurm job id of each of a trial's rungs that ended (its attempt's start record names the job)."""
    jobs, job = [], None
    for entry in _attempts(run_dir):
        job = entry["job_id"] if entry["event"] == "start" else job
        if entry["event"] == "end":
            jobs.append(job)
    return jobs


def test_no_slot_stays_idle_past_a_poll_while_trials_remain(study):
    """Each rung's job ended (Slurm's record of its end) -> the next rung submitted: within IDLE_BOUND_S while trials
    were left to start (after that, a free slot waits for a promotion), except while no controller ran."""
    sweep_dir, _, _, _, (killed, back) = study
    rows = trial_rows(sweep_dir)
    starts = sorted(times[0] for row in rows for times in row["rung_times"].values())
    last_new = max(row["rung_times"][0][0] for row in rows)
    ends = [_slurm_end(job) for row in rows for job in _rung_jobs(sweep_dir / str(row["number"]))]
    gaps = [min(s for s in starts if s >= end) - end for end in ends if end < last_new and not killed <= end <= back]
    assert gaps and max(gaps) <= IDLE_BOUND_S, sorted(gaps)


def test_the_promoted_trial_equals_an_uninterrupted_run_to_its_budget(study, tmp_path):
    """The same overrides run once on Slurm to the full budget (its layout is the trials': ddp over the node's 4
    tasks) end with the promoted trial's parameters, bit for bit."""
    import torch

    sweep_dir, _, _, _, _ = study
    trial = next(row for row in trial_rows(sweep_dir) if row["state"] == "COMPLETE")
    params = [f"{key}={value:g}" for key, value in trial["params"].items()]
    slurm = [arg for arg in _study_overrides(*FULL) if not arg.startswith(("hydra", "trainer.lr=", "trainer.mom"))]
    plain = tmp_path / "plain"
    assert_ok(run_cli([*slurm, *params, f"trainer.max_steps={RUNGS[-1]}", "launcher.wait=true"], plain))
    promoted = torch.load(sweep_dir / str(trial["number"]) / "model.pt", map_location="cpu")
    uninterrupted = torch.load(plain / "model.pt", map_location="cpu")
    for name in promoted:
        assert torch.equal(promoted[name], uninterrupted[name]), name
