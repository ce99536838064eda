"""An adaptive study fed into packed allocations on the Slurm test cluster: 6 trials of ASHA (rungs of 1 and 3
steps) in 2 allocations of 2 GPUs, each rung a one-GPU job step, the controller SIGKILLed once rungs have finished and
started again. Asserted: the allocations were submitted once (the second controller adopted them), every trial is in
the journal once and each of its rungs was claimed and ran once, resuming where the last ended (in whichever
allocation); never more steps at once than the allocations' 4 slots (2 each); steps that ran at the same time on one
node had different GPUs (Slurm's binding, as each step saw it). 38 to 54 s on a loaded machine (load average 8 on 2
cores), in the default suite. And a trial larger than an allocation is refused before anything is queued (3 s).

A plain Hydra app's study (tests/support/scripts/tuned_app, hydra/launcher=hpc_train_slurm with hydra.launcher.pack.*)
is fed the same way: its rungs job steps of 2 allocations submitted once, each resuming its trial's own state in the
trial's output dir (12 s loaded); one larger than an allocation is refused in the app's keys (3 s)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List

import pytest

from hpc_train.jobs.study import trial_rows
from hpc_train.pack import records
from tests.support.cli import TINY, assert_ok
from tests.support.paths import REPO, SCRIPTS

pytestmark = pytest.mark.slurm

RUNGS, TRIALS, SLOTS_PER_ALLOCATION = (1, 3), 6, 2
# Each job step writes what Slurm bound it to (its GPUs, its node) under $GPU_RECORDS, named by its packed run.
SHIM = """\
import json, os
run = os.environ.get("HPC_TRAIN_PACKED_RUN")
if run and os.environ.get("SLURM_PROCID", "0") == "0" and os.environ.get("GPU_RECORDS"):
    keys = ("SLURM_STEP_GPUS", "CUDA_VISIBLE_DEVICES", "SLURMD_NODENAME", "SLURM_JOB_ID", "SLURM_STEP_ID")
    path = os.path.join(os.environ["GPU_RECORDS"], run.replace(":", "_") + ".json")
    with open(path, "w") as handle:
        json.dump({"run": run, **{key: os.environ.get(key) for key in keys}}, handle)
"""


def _command(sweep_dir: Path) -> List[str]:
    return [
        sys.executable,
        "-m",
        "hpc_train.cli",
        "-m",
        "launcher=slurm",
        "cluster.cpus_per_gpu=1",
        "cluster.time=10",
        *TINY,
        "trainer.batch_size=32",
        "trainer.checkpoint_every=0",
        "strategy=single",
        "resources.gpus_per_node=1",
        "launcher.pack.allocations=2",
        f"launcher.pack.gpus_per_node={SLOTS_PER_ALLOCATION}",
        "hydra/sweeper=adaptive",
        "trainer.lr=choice(0.02,0.05,0.1)",
        "trainer.momentum=choice(0,0.9)",
        "hydra.sweeper.sampler=grid",
        f"hydra.sweeper.max_trials={TRIALS}",
        f"hydra.sweeper.max_concurrent={2 * SLOTS_PER_ALLOCATION}",
        f"hydra.sweeper.scheduler.max_resource={RUNGS[-1]}",
        "hydra.sweeper.poll_s=0.5",
        f"hydra.sweep.dir={sweep_dir}",
    ]


def _finished_rungs(sweep_dir: Path) -> int:
    try:
        return sum(len(row["rung_values"]) for row in trial_rows(sweep_dir) or [])
    except Exception:  # the journal's first lines are being written
        return 0


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    """The controller SIGKILLed once 3 rungs have finished (others running or waiting), then the same command."""
    sweep_dir, shim = tmp_path_factory.mktemp("packed_study"), tmp_path_factory.mktemp("shim")
    (shim / "sitecustomize.py").write_text(SHIM)
    gpus = shim / "gpus"
    gpus.mkdir()
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", PYTHONPATH=str(shim), GPU_RECORDS=str(gpus))
    first = subprocess.Popen(
        _command(sweep_dir), cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    deadline = time.monotonic() + 180
    while _finished_rungs(sweep_dir) < 3 and first.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    assert first.poll() is None, first.communicate()[0][-3000:]
    first.send_signal(signal.SIGKILL)
    first.wait()
    killed_at = trial_rows(sweep_dir)
    again = subprocess.run(_command(sweep_dir), cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert_ok(again)
    return sweep_dir, killed_at, again, gpus


def _events(sweep_dir: Path) -> Dict[int, List[dict]]:
    return {plan.index: records.read_events(sweep_dir, plan.index) for plan in records.read_plans(sweep_dir)}


def _attempts(run_dir: Path) -> List[dict]:
    return [json.loads(line) for line in (run_dir / "attempts.jsonl").read_text().splitlines()]


def test_every_trial_once_each_rung_claimed_and_run_once_in_the_adopted_allocations(study):
    sweep_dir, killed_at, again, _ = study
    plans = records.read_plans(sweep_dir)
    assert len(plans) == 2 and all(plan.fed and plan.job_id for plan in plans), plans  # submitted once, adopted
    assert "goes on in its packed allocations" in again.stdout, again.stdout
    assert any(row["status"] == "running" for row in killed_at), killed_at
    rows = trial_rows(sweep_dir)
    assert [row["number"] for row in rows] == list(range(TRIALS))
    claimed = [e["run"] for events in _events(sweep_dir).values() for e in events if e["event"] == "claimed"]
    assert len(claimed) == len(set(claimed)), claimed  # each fed rung claimed by one allocation, once
    allocations = {str(plan.job_id) for plan in plans}
    for row in rows:
        assert row["state"] in ("COMPLETE", "PRUNED"), row
        mine = [run for run in claimed if run.split("-")[0] == str(row["number"])]
        assert len(mine) == len(row["rung_values"]), (row, mine)
        starts = [e for e in _attempts(sweep_dir / str(row["number"])) if e["event"] == "start"]
        assert [e["resumed_from_step"] for e in starts] == [None, *RUNGS[: len(starts) - 1]], (row, starts)
        assert {str(e["job_id"]) for e in starts} <= allocations, starts  # job steps of the allocations
    promoted = next(row for row in rows if row["state"] == "COMPLETE")
    assert len(promoted["rung_values"]) == len(RUNGS)  # resumed at each promotion, to the full budget


def test_never_more_steps_than_slots_and_no_gpu_shared(study):
    sweep_dir, _, _, gpus = study
    events = _events(sweep_dir)
    edges, spans = [], {}
    for index, mine in events.items():
        running = most = 0
        for event in mine:
            if event["event"] in ("started", "ended"):
                running += 1 if event["event"] == "started" else -1
                most = max(most, running)
                edges.append((event["time"], 1 if event["event"] == "started" else -1))
                spans.setdefault(event["run"], []).append(event["time"])
        assert most <= SLOTS_PER_ALLOCATION, (index, most)
    now = peak = 0
    for _, step in sorted(edges):
        now += step
        peak = max(peak, now)
    assert 2 <= peak <= 2 * SLOTS_PER_ALLOCATION, peak
    seen = {json.loads(p.read_text())["run"].split(":")[1]: json.loads(p.read_text()) for p in gpus.glob("*.json")}
    assert set(seen) == set(spans), (sorted(seen), sorted(spans))  # every step recorded what it was bound to
    assert all(len(str(s["SLURM_STEP_GPUS"]).split(",")) == 1 for s in seen.values()), seen
    for a, (a_start, a_end) in spans.items():
        for b, (b_start, b_end) in spans.items():
            same_node = seen[a]["SLURMD_NODENAME"] == seen[b]["SLURMD_NODENAME"]
            if a < b and same_node and a_start < b_end and b_start < a_end:  # ran at the same time on one node
                assert seen[a]["SLURM_STEP_GPUS"] != seen[b]["SLURM_STEP_GPUS"], (seen[a], seen[b])


def test_a_trial_larger_than_an_allocation_is_refused_before_anything_is_queued(tmp_path):
    sweep_dir = tmp_path / "study"
    command = [arg for arg in _command(sweep_dir) if not arg.startswith(("resources.gpus_per_node=", "strategy="))]
    command[4:4] = ["strategy=ddp", "resources.gpus_per_node=4"]  # a 4-GPU trial, in allocations of 2 GPUs
    proc = subprocess.run(
        command, cwd=REPO, env=dict(os.environ, CUDA_VISIBLE_DEVICES=""), capture_output=True, text=True
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    said = proc.stdout + proc.stderr
    assert "`launcher.pack.gpus_per_node`" in said and "the study's trials" in said, said
    assert "set launcher.pack.gpus_per_node=4 or more" in said, said
    assert not records.read_plans(sweep_dir) and not (sweep_dir / "study.journal").exists()


@pytest.mark.scale
def test_a_study_whose_allocations_ended_stops_and_goes_on_in_new_ones(tmp_path):
    """Both allocations cancelled mid-study (as their time running out would end them): the rungs they ran are fed
    again, nothing is left to take them, and the study stops saying so; the same command submits two new allocations
    and the study ends, each cancelled rung fed again and resumed from its trial's checkpoint. 46 to 55 s on a loaded
    machine: in the scale tier."""
    sweep_dir = tmp_path / "study"
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
    first = subprocess.Popen(
        _command(sweep_dir), cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    deadline = time.monotonic() + 180
    while _finished_rungs(sweep_dir) < 2 and first.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    old = [str(plan.job_id) for plan in records.read_plans(sweep_dir)]
    subprocess.run(["scancel", *old], check=True)
    out, _ = first.communicate(timeout=180)
    assert first.returncode != 0 and "have all ended" in out and "Run the same command again" in out, out[-3000:]
    again = subprocess.run(_command(sweep_dir), cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert_ok(again)
    plans = records.read_plans(sweep_dir)
    assert len(plans) == 4 and [str(plan.job_id) for plan in plans[:2]] == old, plans  # two new ones
    new = {str(plan.job_id) for plan in plans[2:]}
    rows = trial_rows(sweep_dir)
    assert [row["number"] for row in rows] == list(range(TRIALS))
    assert all(row["state"] in ("COMPLETE", "PRUNED") for row in rows), rows
    for row in rows:
        starts = [e for e in _attempts(sweep_dir / str(row["number"])) if e["event"] == "start"]
        budgets = [None, *RUNGS]
        # each start resumes where the trial's last finished rung ended (a cancelled rung's start: again, resumed)
        assert all(e["resumed_from_step"] in budgets for e in starts), starts
        assert {str(e["job_id"]) for e in starts} <= set(old) | new, starts
    events = _events(sweep_dir)
    fed_again = {e["run"].split("-")[0] for index in (2, 3) for e in events[index] if e["event"] == "claimed"}
    cut = [run for run, s in records.run_states(sweep_dir).items() if s.state != records.COMPLETED]  # by the scancel
    assert cut and {run.split("-")[0] for run in cut} <= fed_again, (cut, fed_again)


def _app_command(sweep_dir: Path, *extra: str) -> List[str]:
    """tuned_app (gradient descent on (w - 3)^2, `steps` steps at `lr`, its state in its output dir), 4 trials of ASHA
    (rungs of 1 and 3 steps) in 2 allocations of 2 one-GPU slots."""
    return [
        sys.executable,
        str(SCRIPTS / "tuned_app" / "app.py"),
        "-m",
        "hydra/sweeper=adaptive",
        "hydra/launcher=hpc_train_slurm",
        "hydra.launcher.cpus_per_task=1",
        "hydra.launcher.timeout_min=5",
        "hydra.launcher.gpus_per_node=1",
        "hydra.launcher.pack.allocations=2",
        f"hydra.launcher.pack.gpus_per_node={SLOTS_PER_ALLOCATION}",
        "lr=choice(0.1,0.2,0.3,0.4)",
        "hydra.sweeper.sampler=grid",
        "hydra.sweeper.max_trials=4",
        "hydra.sweeper.max_concurrent=4",
        "hydra.sweeper.scheduler.resource_key=steps",
        f"hydra.sweeper.scheduler.max_resource={RUNGS[-1]}",
        "hydra.sweeper.poll_s=0.3",
        f"hydra.sweep.dir={sweep_dir}",
        *extra,
    ]


def test_a_hydra_app_s_study_is_fed_into_its_packed_allocations_each_rung_resuming_its_trial(tmp_path):
    sweep_dir = tmp_path / "app_study"
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
    done = subprocess.run(_app_command(sweep_dir), cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    plans = records.read_plans(sweep_dir)
    assert len(plans) == 2 and all(plan.fed and plan.job_id for plan in plans), plans  # submitted once, fed
    claimed = [e["run"] for events in _events(sweep_dir).values() for e in events if e["event"] == "claimed"]
    assert len(claimed) == len(set(claimed)), claimed
    states = records.run_states(sweep_dir)
    rows = trial_rows(sweep_dir)
    assert [row["number"] for row in rows] == [0, 1, 2, 3]
    for row in rows:
        assert row["state"] in ("COMPLETE", "PRUNED"), row
        mine = [run for run in claimed if run.split("-")[0] == str(row["number"])]
        assert len(mine) == len(row["rung_values"]) and all(states[run].state == records.COMPLETED for run in mine)
        runs = (sweep_dir / str(row["number"]) / "runs.txt").read_text().split("\n")[:-1]
        budgets = RUNGS[: len(row["rung_values"])]  # each rung began where the trial's last one ended
        assert runs == [f"{start} {end}" for start, end in zip((0, *budgets[:-1]), budgets)], runs
        for rung, value in row["rung_values"].items():  # (w - 3)^2 from w = 0 after RUNGS[rung] steps
            assert value == pytest.approx(9.0 * (1.0 - 2.0 * row["params"]["lr"]) ** (2 * RUNGS[rung]), abs=1e-12)
    assert any(len(row["rung_values"]) == len(RUNGS) for row in rows), rows  # promoted, resumed to its full budget
    assert "hpc-train: study done: best trial" in done.stdout, done.stdout


def test_a_hydra_app_s_packed_study_with_a_rung_larger_than_an_allocation_is_refused_before_anything_is_queued(
    tmp_path,
):
    sweep_dir = tmp_path / "app_study"
    command = [arg for arg in _app_command(sweep_dir) if not arg.startswith("hydra.launcher.gpus_per_node=")]
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
    proc = subprocess.run(
        [*command, "hydra.launcher.gpus_per_node=4"], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    said = proc.stdout + proc.stderr
    assert proc.returncode == 2, said
    assert "`hydra.launcher.pack.gpus_per_node`" in said and "the study's trials" in said, said
    assert "set hydra.launcher.pack.gpus_per_node=4 or more" in said and "Traceback" not in said, said
    assert not records.read_plans(sweep_dir) and not (sweep_dir / "study.journal").exists()
