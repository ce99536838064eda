"""A plain Hydra app of the user's (tests/support/scripts/plain_app, no hpc_train in it) swept on the Slurm test cluster
with hydra/launcher=hpc_train_slurm: each job its own resources, a failing job FAILED."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, Tuple

import pytest

from tests.support.paths import REPO, SCRIPTS

pytestmark = pytest.mark.slurm

APP = SCRIPTS / "plain_app"
SLURM = ["hydra/launcher=hpc_train_slurm", "hydra.launcher.cpus_per_task=1", "hydra.launcher.timeout_min=5"]


def sweep(args, sweep_dir: Path) -> subprocess.CompletedProcess:
    """`python my_app.py -m ARGS` as its user runs it: Hydra's plugin scan finds the launcher in the install."""
    command = [sys.executable, "my_app.py", "-m", *args, f"hydra.sweep.dir={sweep_dir}"]
    return subprocess.run(command, cwd=APP, capture_output=True, text=True, timeout=300)


def job_table(sweep_dir: Path):
    lines = (sweep_dir / "jobs.tsv").read_text().splitlines()
    return [dict(zip(lines[0].split("\t"), line.split("\t"))) for line in lines[1:]]


def sacct(job_id: str) -> dict:
    """The job's final state and resources, once slurmdbd has them (accounting lags the job's end by a moment)."""
    deadline = time.monotonic() + 60
    while True:
        out = subprocess.run(
            ["sacct", "-j", job_id, "-X", "-n", "-P", "-o", "State,AllocTRES"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        if out:
            state, tres = out.splitlines()[0].split("|")
            if state in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT") or time.monotonic() > deadline:
                return {"state": state, "tres": tres}
        elif time.monotonic() > deadline:
            raise AssertionError(f"sacct does not know job {job_id}")
        time.sleep(0.5)


def test_each_job_gets_its_own_gpus_from_its_own_config(slurm_cluster, tmp_path):
    proc = sweep([*SLURM, "hydra.launcher.gpus_per_node=${gpus}", "gpus=1,2"], tmp_path / "sweep")
    assert proc.returncode == 0, proc.stderr
    assert "2 job(s): 2 completed, 0 failed" in proc.stderr
    rows = job_table(tmp_path / "sweep")
    assert [row["overrides"] for row in rows] == ["gpus=1", "gpus=2"]
    for row, gpus in zip(rows, (1, 2)):
        accounted = sacct(row["job_id"])
        assert accounted["state"] == "COMPLETED" and f"gres/gpu={gpus}" in accounted["tres"], accounted
        seen = json.loads((tmp_path / "sweep" / row["job"] / "seen.json").read_text())
        assert seen["SLURM_JOB_ID"] == row["job_id"] and seen["SLURM_GPUS_ON_NODE"] == str(gpus)


def test_a_job_that_raises_is_failed_in_sacct_and_counted_failed(slurm_cluster, tmp_path):
    proc = sweep([*SLURM, "fail=false,true"], tmp_path / "sweep")
    assert proc.returncode != 0  # Hydra's sweeper re-raises the failed job's exception
    assert "my_app was asked to fail (gpus=1)" in proc.stderr
    assert "2 job(s): 1 completed, 1 failed" in proc.stderr
    states = {row["overrides"]: sacct(row["job_id"])["state"] for row in job_table(tmp_path / "sweep")}
    assert states == {"fail=False": "COMPLETED", "fail=True": "FAILED"}  # as Hydra's sweeper spells them


def test_wait_false_queues_and_returns_and_a_sweeper_that_needs_results_is_refused(slurm_cluster, tmp_path):
    started = time.monotonic()
    proc = sweep([*SLURM, "hydra.launcher.wait=false", "gpus=1,2"], tmp_path / "sweep")
    assert proc.returncode == 0, proc.stderr
    assert f"2 job(s) queued; sweep dir {tmp_path / 'sweep'}; follow them with: hpc-train-report" in proc.stdout
    assert time.monotonic() - started < 30
    rows = job_table(tmp_path / "sweep")
    assert all(sacct(row["job_id"])["state"] == "COMPLETED" for row in rows)  # they ran after the launcher left
    refused = sweep([*SLURM, "hydra.launcher.wait=false", "hydra/sweeper=optuna", "gpus=1,2"], tmp_path / "optuna")
    assert refused.returncode == 2
    assert "invalid configuration for `hydra.launcher.wait`" in refused.stderr and "Traceback" not in refused.stderr
    assert not (tmp_path / "optuna" / "jobs.tsv").exists()  # nothing was queued


def test_a_job_no_node_can_hold_stops_the_sweep_before_anything_is_queued(slurm_cluster, tmp_path):
    proc = sweep([*SLURM, "hydra.launcher.gpus_per_node=${gpus}", "gpus=1,64"], tmp_path / "sweep")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert (
        "invalid configuration for `hydra.launcher.gpus_per_node`: sweep job #1 (gpus=64): the job asks for 64 GPUs"
        " per node, but the nodes of partition debug (the default) have at most 4. Nothing was queued."
        " Fix: set hydra.launcher.gpus_per_node=4 or fewer."
    ) in proc.stderr
    assert not (tmp_path / "sweep" / "jobs.tsv").exists()


@pytest.mark.parametrize("launcher", ["submitit_slurm", "hpc_train_slurm"])
def test_the_submitit_launchers_example_app_runs_by_changing_one_word(launcher, slurm_cluster, tmp_path):
    """The same app and config under hydra-submitit-launcher and under hpc_train: only hydra/launcher differs."""
    example = SCRIPTS / "submitit_example"
    command = [
        sys.executable,
        "my_app.py",
        "-m",
        f"hydra/launcher={launcher}",
        "task=1,2,3",
        f"hydra.sweep.dir={tmp_path}",
    ]
    proc = subprocess.run(command, cwd=example, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    records = [json.loads((tmp_path / str(n) / "job.json").read_text()) for n in range(3)]
    assert [r["task"] for r in records] == [1, 2, 3]
    assert all(sacct(r["job_id"])["state"] == "COMPLETED" for r in records)  # each in a real Slurm job


def test_rerun_failed_resubmits_exactly_the_failed_job_into_its_own_dir(slurm_cluster, tmp_path):
    needed = tmp_path / "ready"
    sweep_dir = tmp_path / "sweep"
    proc = sweep([*SLURM, f"needs=null,{needed}"], sweep_dir)
    assert proc.returncode != 0 and "1 completed, 1 failed" in proc.stderr
    first = job_table(sweep_dir)
    assert sacct(first[1]["job_id"])["state"] == "FAILED"  # accounting has it (it lags the job's end)
    needed.write_text("now it is there")
    rerun = subprocess.run(
        [sys.executable, "-m", "hpc_train.report.command", str(sweep_dir), "--rerun-failed"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )
    assert rerun.returncode == 0, rerun.stderr
    assert "hpc-train-report: 1 job(s) resubmitted" in rerun.stdout
    rows = job_table(sweep_dir)
    assert rows[:2] == first and len(rows) == 3  # the new attempt is recorded as a new row of the same job
    again = rows[2]
    assert again["job"] == "1" and again["overrides"] == first[1]["overrides"] and again["job_id"] != first[1]["job_id"]
    assert sacct(again["job_id"])["state"] == "COMPLETED"
    seen = json.loads((sweep_dir / "1" / "seen.json").read_text())  # in the job's own dir
    assert seen["SLURM_JOB_ID"] == again["job_id"]
    none_left = subprocess.run(
        [sys.executable, "-m", "hpc_train.report.command", str(sweep_dir), "--rerun-failed"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )
    assert "0 job(s) resubmitted: none failed" in none_left.stdout


# The time limit's signal (submitit's USR2, sent as its own _interrupt sends it) and a requeue from outside
STOPS = {"time-limit-signal": ["scancel", "--signal", "USR2"], "scontrol-requeue": ["scontrol", "requeue"]}


@pytest.fixture(scope="module")
def stopped_apps(slurm_cluster, tmp_path_factory) -> Dict[str, Tuple[Path, str, int, str, str]]:
    """The app's one-job sweep twice, side by side (one requeue's time, not two), each job stopped by STOPS' command
    once it started; (sweep dir, Slurm id, the launcher's exit code, its stdout, its stderr) by STOPS' name."""
    folder = tmp_path_factory.mktemp("stopped")
    launchers: Dict[str, subprocess.Popen] = {}
    try:
        for name in STOPS:
            command = [
                sys.executable, "my_app.py", "-m", *SLURM, "hydra.launcher.max_num_timeout=1", "sleep_s=300", "gpus=2",
                f"hydra.sweep.dir={folder / name}",
            ]  # fmt: skip
            launchers[name] = subprocess.Popen(
                command, cwd=APP, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
            )
        stopped: Dict[str, str] = {}
        deadline = time.monotonic() + 120
        while len(stopped) < len(STOPS):
            for name in [name for name in STOPS if name not in stopped]:
                assert launchers[name].poll() is None, launchers[name].communicate()
                assert time.monotonic() < deadline, f"{name}: the job never started"
                attempts = folder / name / "0" / "attempts.txt"
                if attempts.exists() and attempts.read_text().strip():
                    stopped[name] = attempts.read_text().split()[0]
                    subprocess.run([*STOPS[name], stopped[name]], check=True)
            time.sleep(0.5)
        said = {name: launcher.communicate(timeout=180) for name, launcher in launchers.items()}
    finally:
        for launcher in launchers.values():
            if launcher.poll() is None:
                launcher.kill()
    return {name: (folder / name, stopped[name], launchers[name].returncode, *said[name]) for name in STOPS}


@pytest.mark.parametrize("stop", list(STOPS))
def test_the_time_limit_signal_requeues_the_job_within_max_num_timeout(stopped_apps, stop):
    """As with the submitit launcher: the signal Slurm sends before the time limit (submitit's USR2, sent here
    with scancel as submitit's own _interrupt sends it, not waiting for the limit) makes the job requeue itself
    while hydra.launcher.max_num_timeout allows; the requeued attempt runs in the same job dir and the sweep
    ends with its result. A requeue from outside (a preemption) is followed the same way, said in one line."""
    sweep_dir, job_id, returncode, out, err = stopped_apps[stop]
    attempts = sweep_dir / "0" / "attempts.txt"
    assert returncode == 0, err
    assert "1 job(s): 1 completed, 0 failed" in err
    assert out.count("was requeued by Slurm (attempt 2); following it to the end of its last attempt") == 1, out
    assert attempts.read_text().split("\n")[:2] == [f"{job_id} 0", f"{job_id} 1"]  # requeued: same job, restart 1
    assert sacct(job_id)["state"] == "COMPLETED"
    assert json.loads((sweep_dir / "0" / "seen.json").read_text())["SLURM_JOB_ID"] == job_id


def test_a_cluster_profile_of_the_users_supplies_the_defaults(slurm_cluster, tmp_path):
    """hydra.launcher.cluster: hpc_train's profiles (here one of the user's, built on the shipped `slurm` one)."""
    profile = tmp_path / "my_conf" / "cluster" / "testsite.yaml"
    profile.parent.mkdir(parents=True)
    profile.write_text(
        "defaults:\n  - slurm\n  - _self_\n\nname: testsite\npartition: gpu_p2\ncpus_per_gpu: 1\n"
        "setup:\n  - export FROM_PROFILE=yes\n"
    )
    sweep_dir = tmp_path / "sweep"
    proc = sweep(
        [
            "hydra/launcher=hpc_train_slurm",
            "hydra.launcher.timeout_min=5",
            f"hydra.launcher.cluster={profile}",
            "hydra.launcher.gpus_per_node=2",
        ],
        sweep_dir,
    )
    assert proc.returncode == 0, proc.stderr
    seen = json.loads((sweep_dir / "0" / "seen.json").read_text())
    assert seen["SLURM_JOB_PARTITION"] == "gpu_p2" and seen["FROM_PROFILE"] == "yes"
    assert seen["SLURM_CPUS_PER_TASK"] == "2" and seen["SLURM_GPUS_ON_NODE"] == "2"  # cpus_per_gpu x GPUs


# 220 jobs on the suite's cluster (arrays cut at 200 tasks); 1,100 (Hydra composes each: minutes) is a scale test.
@pytest.mark.parametrize("jobs", [220, pytest.param(1100, marks=pytest.mark.scale)])
def test_a_big_app_sweep_is_cut_into_arrays_under_max_array_size(slurm_cluster, tmp_path, jobs):
    """Queued held (nothing runs) and cancelled: what is checked is how the jobs went in."""
    from tests.slurm.test_sweep_slurm import sweep_sizes

    sweep_dir = tmp_path / "sweep"
    sizes = sweep_sizes(jobs)
    args = [
        *SLURM,
        "hydra.launcher.wait=false",
        "+hydra.launcher.additional_parameters={hold:true}",
        f"gpus=range(1,{jobs + 1})",
    ]
    proc = sweep(args, sweep_dir)
    rows = job_table(sweep_dir) if (sweep_dir / "jobs.tsv").exists() else []
    arrays = sorted({row["job_id"].split("_")[0] for row in rows}, key=int)
    try:
        assert proc.returncode == 0, proc.stderr
        assert len(rows) == jobs and len(sizes) >= 2
        assert [sum(1 for row in rows if row["job_id"].startswith(f"{array}_")) for array in arrays] == sizes
        assert [row["overrides"] for row in rows] == [f"gpus={n}" for n in range(1, jobs + 1)]
    finally:
        subprocess.run(["scancel", *arrays], check=False)


def test_slurms_own_refusal_names_the_apps_launcher_key(slurm_cluster, tmp_path):
    proc = sweep([*SLURM, "hydra.launcher.constraint=no_such_feature", "gpus=1,2"], tmp_path / "sweep")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert "invalid configuration for `hydra.launcher.constraint`: Slurm refused the job:" in proc.stderr
    assert "Invalid feature specification" in proc.stderr
    assert "Fix: pass hydra.launcher.constraint=" in proc.stderr and "cluster." not in proc.stderr
    assert not (tmp_path / "sweep" / "jobs.tsv").exists()


def test_the_report_of_an_app_sweep_shows_each_jobs_state_and_return_value(slurm_cluster, tmp_path):
    sweep_dir = tmp_path / "sweep"
    proc = sweep([*SLURM, "hydra.launcher.wait=false", "gpus=1,2,3", "fail=false"], sweep_dir)
    assert proc.returncode == 0, proc.stderr
    for row in job_table(sweep_dir):
        sacct(row["job_id"])  # ended
    shown = subprocess.run(
        [sys.executable, "-m", "hpc_train.report.command", str(sweep_dir), "--json"],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    assert shown.returncode == 0, shown.stderr
    found = json.loads(shown.stdout)
    assert [(r["overrides"], r["state"], r["result"]) for r in found] == [
        (f"gpus={n} fail=False", "COMPLETED", str(n)) for n in (1, 2, 3)
    ]
