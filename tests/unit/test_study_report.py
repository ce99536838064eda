"""hpc-train-report of an adaptive sweep: journals written with Optuna's own API (the attributes named in
hpc_train.jobs.study) and run dirs shaped like a real study's; the table, counts, best and device-hours checked
against numbers worked out by hand, --watch followed to the study's end, and nothing written into the sweep dir."""

from __future__ import annotations

import io
import json
import os
from pathlib import Path

import optuna
import pytest
import yaml
from optuna.trial import TrialState

from hpc_train.jobs import study as names
from hpc_train.records import run_claim
from hpc_train.report import command, study_report, watch

BUDGETS = [1, 3, 9]  # min_resource 1, eta 3, max_resource 9


def _info(**changes):
    info = {
        "direction": "minimize",
        "objective": "eval_loss",
        "resource_key": "trainer.max_steps",
        "budgets": BUDGETS,
        "max_trials": 6,
        "max_concurrent": 2,
    }
    return {**info, **changes}


def _run_dir(sweep_dir: Path, number: int, nodes: int, tasks: int, device: str) -> Path:
    """A trial's run dir as a rung leaves it: job_config.yaml with the job's layout, summary.json with its device."""
    run_dir = sweep_dir / str(number)
    run_dir.mkdir(parents=True)
    layout = {
        "strategy": "ddp",
        "nodes": nodes,
        "tasks_per_node": tasks,
        "gpus_per_node": tasks,
        "gpus_per_task": 1,
        "cpus_per_task": 1,
        "mesh": None,
        "max_nodes": None,
        "data_parallel_size": nodes * tasks,
        "world_size": nodes * tasks,
    }
    spec = {"objective": "eval_loss", "job": {"run_dir": str(run_dir), "layout": layout, "sweep": None}}
    (run_dir / "job_config.yaml").write_text(yaml.safe_dump(spec))
    summary = {"strategy": "ddp", "world_size": nodes * tasks, "device": device, "eval_loss": 2.0}
    (run_dir / "summary.json").write_text(json.dumps(summary))
    return run_dir


def _journal(sweep_dir: Path, info, trials, direction="minimize"):
    """A study in `sweep_dir`'s journal: each trial (params, status, rung, {rung: value}, {rung: seconds}, state,
    error) asked, given its attributes and intermediate values as the controller gives them, and told its state."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    made = optuna.create_study(storage=names.storage(sweep_dir), study_name=names.STUDY_NAME, direction=direction)
    if info is not None:
        made.set_user_attr(names.INFO, info)
    space = {"trainer.lr": optuna.distributions.FloatDistribution(0.001, 1.0)}
    for lr, status, rung, values, seconds, state, error in trials:
        made.enqueue_trial({"trainer.lr": lr})
        trial = made.ask(fixed_distributions=space)
        number = trial.number
        attrs = {
            names.STATUS: status,
            names.RUNG: rung,
            names.BRACKET: 0,
            names.RUN_DIR: str(sweep_dir / str(number)),
            names.RUNG_VALUES: {str(k): v for k, v in values.items()},
            names.RUNG_SECONDS: {str(k): v for k, v in seconds.items()},
        }
        if error:
            attrs[names.ERROR] = error
        for key, value in attrs.items():
            trial.set_user_attr(key, value)
        for k, value in values.items():
            trial.report(value, BUDGETS[k])
        if state == TrialState.COMPLETE:
            made.tell(number, values[max(values)])
        elif state != TrialState.RUNNING:
            made.tell(number, state=state)
    return made


OOM = "RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB\nTraceback (most recent call last):\n  ..."
GPU_TRIALS = [  # lr, status, rung, {rung: objective}, {rung: seconds}, Optuna's state, error
    (0.1, "completed", 2, {0: 2.0, 1: 1.5, 2: 1.2}, {0: 1000, 1: 2000, 2: 6000}, TrialState.COMPLETE, None),
    (0.2, "stopped", 0, {0: 2.5}, {0: 1200}, TrialState.PRUNED, None),
    (0.3, "running", 2, {0: 1.8, 1: 1.6}, {0: 900, 1: 1800}, TrialState.RUNNING, None),
    (0.05, "paused", 0, {0: 2.2}, {0: 1100}, TrialState.RUNNING, None),
    (0.01, "failed", 0, {}, {}, TrialState.FAIL, OOM),
    (0.02, "running", 0, {}, {}, TrialState.RUNNING, None),
]


@pytest.fixture
def gpu_study(tmp_path):
    """Six trials on GPUs: trial 1 on 2 nodes x 4 GPUs, every other on 1 node x 2 GPUs."""
    sweep_dir = tmp_path / "study"
    sweep_dir.mkdir()
    for number in range(len(GPU_TRIALS)):
        _run_dir(sweep_dir, number, 2 if number == 1 else 1, 4 if number == 1 else 2, "cuda")
    _journal(sweep_dir, _info(), GPU_TRIALS)
    return sweep_dir


def _files(folder: Path):
    return {str(path): path.stat().st_mtime_ns for path in sorted(folder.rglob("*"))}


def test_the_report_of_a_study_shows_each_trial_its_rungs_status_the_best_and_the_gpu_hours(gpu_study, capsys):
    before = _files(gpu_study)
    assert command.main([str(gpu_study)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"hpc-train-report: {gpu_study} (adaptive study of 6 trials, minimize eval_loss)"
    assert out[1:9] == [
        "trial  best  trainer.lr  rung 0 @1  rung 1 @3  rung 2 @9  status",
        "-----  ----  ----------  ---------  ---------  ---------  " + "-" * 78,
        "    0  *            0.1     2.0000     1.5000     1.2000  completed",
        "    1               0.2     2.5000          -          -  stopped at rung 0",
        "    2               0.3     1.8000     1.6000          -  promoted to rung 2, running",
        "    3              0.05     2.2000          -          -  paused at rung 0",
        "    4              0.01          -          -          -  failed at rung 0: RuntimeError: CUDA out of memory."
        " Tried to allocate 2.00 GiB",
        "    5              0.02          -          -          -  running rung 0",
    ]
    assert out[10] == "trials: 1 completed, 1 stopped, 1 failed, 2 running, 1 paused (6 of 6 started)"
    assert out[11] == "best: trial 0, eval_loss = 1.2, trainer.lr=0.1"
    # spent: trial 0 9000 s x 2 GPUs + trial 1 1200 s x 8 + trial 2 2700 s x 2 + trial 3 1100 s x 2 = 35,200 s
    # full budget (9 steps): 9000/9*9 x 2 + 1200/1*9 x 8 + 2700/3*9 x 2 + 1100/1*9 x 2 = 140,400 s; ratio 0.2507
    assert out[12] == (
        "GPU-hours (seconds x GPUs): 9.78 spent on the finished rungs, against 39.00 for every trial at"
        " trainer.max_steps=9; ratio 0.25"
    )
    assert _files(gpu_study) == before  # read-only


def test_a_cpu_study_counts_ranks_and_before_any_completed_trial_the_best_at_the_highest_rung(tmp_path, capsys):
    """Maximize, no trial completed yet, the objective from the trials' job_config.yaml (the sweeper's was the
    config's), the demo's CPU layout (gpus_per_task 1, summary device cpu): its ranks are its devices."""
    trials = [
        (0.1, "paused", 1, {0: 0.30, 1: 0.40}, {0: 360, 1: 720}, TrialState.RUNNING, None),
        (0.2, "paused", 1, {0: 0.35, 1: 0.45}, {0: 360, 1: 720}, TrialState.RUNNING, None),
        (0.3, "stopped", 0, {0: 0.5}, {0: 360}, TrialState.PRUNED, None),
    ]
    for number in range(3):
        _run_dir(tmp_path, number, 1, 2, "cpu")
    _journal(tmp_path, _info(direction="maximize", objective=None, max_trials=3), trials, direction="maximize")
    assert study_report.main(tmp_path, as_json=False) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"hpc-train-report: {tmp_path} (adaptive study of 3 trials, maximize eval_loss)"
    assert out[3:6] == [
        "    0               0.1     0.3000     0.4000          -  paused at rung 1",
        "    1  *            0.2     0.3500     0.4500          -  paused at rung 1",
        "    2               0.3     0.5000          -          -  stopped at rung 0",
    ]
    assert out[7] == "trials: 0 completed, 1 stopped, 0 failed, 0 running, 2 paused (3 of 3 started)"
    assert out[8] == "best so far (none completed): trial 1, eval_loss = 0.45 at rung 1, trainer.lr=0.2"
    # spent: (1080 + 1080 + 360) s x 2 ranks = 5040 s; full: 1080/3*9 x 2 x 2 + 360*9 x 2 = 19,440 s; ratio 0.259
    assert out[9] == (
        "device-hours (CPU runs: seconds x ranks): 1.40 spent on the finished rungs, against 5.40 for every trial at"
        " trainer.max_steps=9; ratio 0.26"
    )


def test_watch_follows_a_study_until_every_trial_has_ended(gpu_study, tmp_path):
    """A look while trials run and their controller (here: this process's claim on the sweep dir) is alive goes on; a
    study whose trials all ended ends the watch (0: a trial completed, none failed), through the report's one watch
    loop."""
    run_claim.acquire(gpu_study, "this-test", command="hpc-train -m ...", how="in the foreground")
    text, code = study_report.look(gpu_study)
    assert code is None and "trials: 1 completed, 1 stopped, 1 failed, 2 running, 1 paused" in text
    assert f"controller: running, pid {os.getpid()} on " in text and "in the foreground" in text, text
    done = tmp_path / "done"
    done.mkdir()
    for number in range(2):
        _run_dir(done, number, 1, 2, "cuda")
    _journal(done, _info(max_trials=2), GPU_TRIALS[:2])
    out = io.StringIO()
    assert watch.watch(done, every=0.01, out=out) == 0
    assert out.getvalue().count("hpc-train-report --watch") == 1
    assert "trials: 1 completed, 1 stopped, 0 failed, 0 running, 0 paused (2 of 2 started)" in out.getvalue()


def test_watch_ends_when_the_study_s_controller_is_gone_or_none_holds_it(gpu_study):
    """A controller whose process is gone (its claim left behind, as by a SIGKILL), or no controller at all: the
    report says so, with the command that goes on with the study, and --watch ends (1: the study did not end)."""
    run_claim.acquire(gpu_study, "killed", command="hpc-train -m hydra/sweeper=adaptive", how="detached")
    claim = json.loads((gpu_study / run_claim.CLAIM).read_text())
    claim["pid_start"] -= 1  # its pid now another process's: the controller that held it is gone
    (gpu_study / run_claim.CLAIM).write_text(json.dumps(claim))
    text, code = study_report.look(gpu_study)
    assert code == 1, text
    assert "controller: gone, last seen alive at" in text and f"pid {os.getpid()} on" in text, text
    assert "nothing runs the study: run `hpc-train -m hydra/sweeper=adaptive` again to go on with it" in text
    assert text.endswith("the study has not ended and its controller is not running; --watch ends")
    run_claim.release(gpu_study, "killed")
    text, code = study_report.look(gpu_study)
    assert code == 1 and "controller: none (it ended, or was never started on this sweep dir)" in text, text


def test_the_json_of_a_study(gpu_study, capsys):
    """--json: the study's facts, its trials as jobs.study gives them, the best's number, the cost in exact hours."""
    assert command.main([str(gpu_study), "--json"]) == 0
    found = json.loads(capsys.readouterr().out)
    assert found["best"] == 0 and found["study"]["budgets"] == BUDGETS
    assert [row["status"] for row in found["trials"]] == [row[1] for row in GPU_TRIALS]
    assert found["cost"] == {"spent_h": 35200 / 3600, "full_h": 140400 / 3600, "cpu": False}
