"""hydra/sweeper=adaptive on this machine (launcher=local): an ASHA study whose controller is killed mid-study (a
second controller refused while it ran, the report saying it is gone after) and started again detached, every trial
in the journal once, a promoted trial equal to an uninterrupted run to its budget (its cosine LR schedule the same at
every rung), and the refusals before any trial starts."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from hpc_train.jobs.study import JOURNAL, controller_state, trial_rows
from hpc_train.records import run_claim
from tests.support.cli import TINY, assert_ok, run_cli, run_cli_in_process
from tests.support.paths import REPO, SCRIPTS

TRIALS, SLOTS, RUNGS = 4, 2, (1, 3, 9)  # min_resource 1, eta 3, max_resource 9: rungs of 1, 3 and 9 steps
STUDY = [
    *TINY,
    "trainer.batch_size=32",
    "trainer.checkpoint_every=0",
    "trainer.lr_schedule=cosine",  # the default: a schedule over the run's length, which each rung changes
    "hydra/sweeper=adaptive",
    "trainer.lr=interval(0.01,0.3)",
    "hydra.sweeper.sampler=random",
    "hydra.sweeper.seed=3",
    f"hydra.sweeper.max_trials={TRIALS}",
    f"hydra.sweeper.max_concurrent={SLOTS}",
    f"hydra.sweeper.scheduler.max_resource={RUNGS[-1]}",
    "hydra.sweeper.poll_s=0.3",
]


def _command(sweep_dir: Path):
    return [sys.executable, "-m", "hpc_train.cli", "-m", *STUDY, f"hydra.sweep.dir={sweep_dir}"]


def _mid_study(sweep_dir: Path) -> bool:
    """Two trials have finished a rung and a rung is running: the moment the kill is meant to interrupt (right
    after a rung ends, every trial can be paused for an instant before the controller starts the next)."""
    try:
        rows = trial_rows(sweep_dir) or []
    except Exception:  # the journal's first lines are being written
        return False
    finished_a_rung = [row for row in rows if row["rung_values"]]
    return len(finished_a_rung) >= 2 and any(row["status"] == "running" for row in rows)


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    """The study's controller killed (SIGKILL) once two trials have finished a rung while another runs (a second
    controller started meanwhile, refused, and gone before the kill), its report watched, then the same command again
    with controller=detached, which returns at once: the study ends in the background."""
    sweep_dir = tmp_path_factory.mktemp("study")
    first = subprocess.Popen(_command(sweep_dir), cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    second = None
    deadline = time.monotonic() + 240
    while first.poll() is None and time.monotonic() < deadline:
        if second is None and (sweep_dir / JOURNAL).exists():  # the first controller holds the study
            second = subprocess.Popen(_command(sweep_dir), cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        if second is not None and second.poll() is not None and _mid_study(sweep_dir):
            break
        time.sleep(0.2)
    assert second is not None
    refused = second.communicate(timeout=120)[0].decode(), second.returncode
    assert first.poll() is None, first.communicate()[0].decode()[-3000:]
    first.send_signal(signal.SIGKILL)
    first.wait()
    killed_at = trial_rows(sweep_dir)
    watch = [sys.executable, "-m", "hpc_train.report.command", str(sweep_dir), "--watch", "--every", "0.2"]
    watched = subprocess.run(watch, cwd=REPO, capture_output=True, text=True, timeout=60)
    detach = [*_command(sweep_dir), "hydra.sweeper.controller=detached"]
    detached = subprocess.run(detach, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert_ok(detached)
    held = run_claim.read(sweep_dir)
    alive_then, session = controller_state(sweep_dir), os.getsid(held.pid)
    while Path(f"/proc/{held.pid}").exists() and time.monotonic() < deadline + 600:  # the controller's end
        time.sleep(0.3)
    seen = SimpleNamespace(first=first.pid, refused=refused, watched=watched, detached=detached, held=held)
    seen.alive_then, seen.session, seen.log = alive_then, session, (sweep_dir / "controller.log").read_text()
    return sweep_dir, killed_at, seen


def test_a_controller_killed_mid_study_and_started_again_ends_it_with_every_trial_once(study):
    sweep_dir, killed_at, again = study
    rows = trial_rows(sweep_dir)
    assert [row["number"] for row in rows] == list(range(TRIALS))
    assert any(row["status"] == "running" for row in killed_at), killed_at  # the kill left rungs running
    assert {row["state"] for row in rows} <= {"COMPLETE", "PRUNED"}, rows
    for row in rows:
        assert row["run_dir"] == str(sweep_dir / str(row["number"]))
        starts = [
            json.loads(line) for line in (sweep_dir / str(row["number"]) / "attempts.jsonl").read_text().splitlines()
        ]
        starts = [entry for entry in starts if entry["event"] == "start"]
        # each rung ran once: one attempt per rung, each resuming where the last rung ended
        assert len(starts) == len(row["rung_values"]), (row, starts)
        assert [entry["resumed_from_step"] for entry in starts] == [None, *RUNGS[: len(starts) - 1]]
        assert sorted(row["intermediate"]) == list(RUNGS[: len(row["rung_values"])])
    best = json.loads(json.dumps(rows))  # plain data
    completed = [row for row in best if row["state"] == "COMPLETE"]
    assert completed and all(row["rung"] == len(RUNGS) - 1 for row in completed)
    assert "hpc-train: study done: best trial" in again.log  # the detached controller's output


def test_a_second_controller_of_a_study_is_refused_while_the_first_runs(study):
    _, _, seen = study
    out, code = seen.refused
    assert code == 2, out
    assert "already has a live controller: pid" in out and f"pid {seen.first} " in out, out
    assert "in the foreground, started by: hpc-train -m" in out, out  # how it was started
    assert "Fix: follow it with `hpc-train-report" in out and f"kill {seen.first} on" in out, out


def test_the_report_of_a_killed_controller_says_it_is_gone_and_watch_ends(study):
    sweep_dir, _, seen = study
    watched = seen.watched
    assert watched.returncode == 1, watched.stdout + watched.stderr
    assert "controller: gone, last seen alive at" in watched.stdout, watched.stdout
    assert "nothing runs the study: run `hpc-train -m" in watched.stdout, watched.stdout  # the command to go on
    assert "the study has not ended and its controller is not running; --watch ends" in watched.stdout


def test_a_detached_controller_returns_at_once_and_ends_the_study_in_the_background(study):
    sweep_dir, _, seen = study
    assert "the study's controller runs as process" in seen.detached.stdout, seen.detached.stdout
    assert f"hpc-train-report {sweep_dir} --watch" in seen.detached.stdout
    alive, line = seen.alive_then  # when the command had returned, its controller ran on
    assert alive is True and f"detached, its output in {sweep_dir / 'controller.log'}" in line, line
    assert seen.session == seen.held.pid  # a session of its own: a closed terminal's hangup does not reach it
    assert seen.held.command.endswith("hydra.sweeper.controller=detached")  # what starts it again
    assert "hpc-train: taking over run dir" in seen.detached.stdout  # the killed controller's claim
    assert run_claim.read(sweep_dir) is None  # released at the study's end


def test_a_promoted_trial_ends_with_the_parameters_of_an_uninterrupted_run_to_its_budget(study, tmp_path):
    import torch

    sweep_dir, _, _ = study
    trial = next(row for row in trial_rows(sweep_dir) if row["state"] == "COMPLETE")
    lr = trial["params"]["trainer.lr"]
    plain = tmp_path / "plain"
    overrides = [*TINY, "trainer.batch_size=32", "trainer.checkpoint_every=0", f"trainer.lr={lr}"]
    # its rungs of 1 and 3 steps decayed the LR over the full budget, as this run does
    schedule = ["trainer.lr_schedule=cosine", f"trainer.lr_schedule_steps={RUNGS[-1]}"]
    assert_ok(run_cli([*overrides, *schedule, f"trainer.max_steps={RUNGS[-1]}"], plain))
    promoted = torch.load(sweep_dir / str(trial["number"]) / "model.pt", map_location="cpu")
    uninterrupted = torch.load(plain / "model.pt", map_location="cpu")
    assert promoted.keys() == uninterrupted.keys()
    for name in promoted:
        assert torch.equal(promoted[name], uninterrupted[name]), name  # bit-identical


def test_the_report_counts_the_study_s_trials_and_names_its_best_as_the_journal_does(study):
    """hpc-train-report on the study's sweep dir, in a process that imports no torch: its counts and its best trial
    (number, objective, parameters) are the journal's, and it writes nothing into the sweep dir."""
    sweep_dir, _, _ = study
    rows = trial_rows(sweep_dir)
    before = sorted(str(path) for path in sweep_dir.rglob("*"))
    code = (
        "import sys; from hpc_train.report import command; code = command.main([sys.argv[1]]);"
        " assert 'torch' not in sys.modules, 'the report imported torch'; sys.exit(code)"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(sweep_dir)], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    completed = [row for row in rows if row["status"] == "completed"]
    stopped = sum(row["status"] == "stopped" for row in rows)
    counts = f"trials: {len(completed)} completed, {stopped} stopped, 0 failed, 0 running, 0 paused"
    assert f"{counts} ({TRIALS} of {TRIALS} started)" in lines, done.stdout
    best = min(completed, key=lambda row: (row["value"], row["number"]))  # the study minimizes
    params = " ".join(f"{name}={value}" for name, value in best["params"].items())
    assert f"best: trial {best['number']}, eval_loss = {best['value']:g}, {params}" in lines, done.stdout
    assert sorted(str(path) for path in sweep_dir.rglob("*")) == before


@pytest.mark.parametrize(
    "extra, key",
    [
        (["hydra.sweeper.scheduler.resource_key=trainer.no_such_key"], "hydra.sweeper.scheduler.resource_key"),
        (["hydra.sweeper.scheduler.min_resource=10"], "hydra.sweeper.scheduler.min_resource"),
        (["objective=eval_loss", "trainer.eval=false"], "objective"),
        (["dry_run=true"], "dry_run"),
        (["trainer.max_steps=1,2"], "hydra.sweeper.scheduler.resource_key"),
        (["hydra.sweeper.scheduler.resource_key=trainer.epochs"], "trainer.lr_schedule_steps"),
    ],
    ids=[
        "resource-key-unread",
        "min-above-max",
        "objective-never-reported",
        "dry-run",
        "resource-key-swept",
        "cosine-over-epochs",
    ],
)
def test_a_study_that_cannot_work_is_refused_before_any_trial(extra, key, tmp_path):
    proc = run_cli_in_process(["-m", *STUDY, *extra, f"hydra.sweep.dir={tmp_path / 'study'}"], refused=True)
    assert f"`{key}`" in proc.stdout + proc.stderr or key in proc.stdout + proc.stderr, proc.stdout + proc.stderr
    assert "Fix:" in proc.stdout + proc.stderr
    assert not (tmp_path / "study" / "0").exists()  # no trial started


def test_a_plain_hydra_app_reporting_its_objective_is_swept_with_asha_and_resumes_its_own_state(tmp_path):
    """tests/support/scripts/tuned_app: gradient descent on (w - 3)^2, `steps` steps at `lr`, its state in its output
    dir, hpc_train.report_objective(step, loss) each step; its jobs started by hydra/launcher=hpc_train_local."""
    sweep_dir = tmp_path / "app_study"
    command = [sys.executable, str(SCRIPTS / "tuned_app" / "app.py"), "-m", "hydra/sweeper=adaptive"]
    command += ["hydra/launcher=hpc_train_local", "lr=interval(0.01,0.9)", "hydra.sweeper.sampler=random"]
    command += ["hydra.sweeper.seed=2", f"hydra.sweeper.max_trials={TRIALS}", f"hydra.sweeper.max_concurrent={SLOTS}"]
    command += ["hydra.sweeper.scheduler.resource_key=steps", f"hydra.sweeper.scheduler.max_resource={RUNGS[-1]}"]
    done = subprocess.run(
        [*command, "hydra.sweeper.poll_s=0.3", f"hydra.sweep.dir={sweep_dir}"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    rows = trial_rows(sweep_dir)
    assert [row["number"] for row in rows] == list(range(TRIALS))
    for row in rows:
        runs = (sweep_dir / str(row["number"]) / "runs.txt").read_text().split("\n")[:-1]
        # each rung ran once, starting where the trial's last rung ended, with the next rung's budget
        budgets = RUNGS[: len(row["rung_values"])]
        assert runs == [f"{start} {end}" for start, end in zip((0, *budgets[:-1]), budgets)], runs
        for rung, value in row["rung_values"].items():
            expected = 9.0 * (1.0 - 2.0 * row["params"]["lr"]) ** (2 * RUNGS[rung])  # (w - 3)^2 from w = 0
            # the app's steps round w - 3 each time: near 0 the relative error grows, its size stays below 1e-12
            assert value == pytest.approx(expected, rel=1e-9, abs=1e-12)
    best = min((row for row in rows if row["state"] == "COMPLETE"), key=lambda row: row["value"])
    assert f"hpc-train: study done: best trial {best['number']}," in done.stdout


def test_rerun_failed_on_a_study_says_to_run_its_command_again_and_submits_nothing(study, capsys):
    """A study's trials belong to its controller: --rerun-failed would start rungs its journal does not know."""
    from hpc_train.report import command

    sweep_dir, _, _ = study
    before = sorted(str(path) for path in sweep_dir.rglob("*"))
    assert command.main([str(sweep_dir), "--rerun-failed"]) != 0
    said = capsys.readouterr()
    assert "holds an adaptive study" in said.err and "run the study's command again" in said.err, said
    assert sorted(str(path) for path in sweep_dir.rglob("*")) == before


def test_a_plain_hydra_app_s_study_that_cannot_work_is_refused_in_one_message(tmp_path):
    """A Hydra app has no hpc-train command line around it: its study's refusal is the app launcher's (its message
    with the key and the fix, exit code 2, no traceback, nothing started)."""
    sweep_dir = tmp_path / "app_study"
    command = [sys.executable, str(SCRIPTS / "tuned_app" / "app.py"), "-m", "hydra/sweeper=adaptive"]
    command += ["hydra/launcher=hpc_train_local", "lr=interval(0.01,0.9)", "hydra.sweeper.scheduler.max_resource=9"]
    command += ["hydra.sweeper.scheduler.resource_key=no_such_key", f"hydra.sweep.dir={sweep_dir}"]
    done = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    said = done.stdout + done.stderr
    assert done.returncode == 2, said
    assert "hydra.sweeper.scheduler.resource_key" in said and "Fix:" in said, said
    assert "Traceback" not in said and "Error executing job" not in said, said
    assert not (sweep_dir / "0").exists()
