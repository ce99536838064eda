"""Ctrl-C while a sweep (or one job) is being queued, on the real Slurm test cluster.

The command runs in its own process group and gets SIGINT there, as a terminal sends Ctrl-C to
the whole group: the sbatch under way gets it too. Every job has its own time limit, so each is
its own sbatch call; jobs are submitted held (``--hold``) so none runs. A stand-in for sbatch
(``hanging_sbatch``) lets the controller make the job and then hangs before printing its id: the
case of an sbatch cut off after Slurm made its job, which the command must find and cancel.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Callable, Dict, List, Optional

import pytest

from hpc_train import compose
from hpc_train.launch.backends.slurm import queueing as slurm_queueing
from hpc_train.launch.backends.slurm import submit as slurm
from hpc_train.launch.planning.jobspec import build_job_spec
from hpc_train.launch.planning.plan import make_plan
from tests.support.cli import wait_for
from tests.support.paths import REPO, SCRIPTS

pytestmark = pytest.mark.slurm

HELD = ["launcher=slurm", "cluster.cpus_per_gpu=1", "model=toy_mlp", "+cluster.extra.hold=true"]
APP = SCRIPTS / "plain_app"
APP_HELD = [
    "hydra/launcher=hpc_train_slurm",
    "hydra.launcher.cpus_per_task=1",
    "hydra.launcher.wait=false",
    "+hydra.launcher.additional_parameters.hold=true",
]
MESSAGE = re.compile(
    r"^hpc-train: interrupted while queueing the (sweep|job): (.*); nothing of the \1 is left in Slurm\."
)

# sbatch, except that its call number $HANG_AT hangs once Slurm has made the job, before printing the id. The hang is
# one process that writes the marker itself, SIGINT at its default first, so a Ctrl-C sent once the marker is there
# always ends it. A marker written by a child of bash would not do: a SIGINT that lands while bash reaps that child
# (exited 0) is taken by bash as handled by the child (its wait-and-cooperative-exit rule), bash carries on, and the
# hang it then starts never sees the Ctrl-C: the command waits on the sbatch's pipes until the hang ends.
HANG = (
    "import signal, sys, time; signal.signal(signal.SIGINT, signal.SIG_DFL); open(sys.argv[1], 'w').close();"
    " time.sleep(120)"
)
HANGING_SBATCH = """#!/bin/bash
out=$("$REAL_SBATCH" "$@") || exit $?
calls=$(( $(cat "$SHIM_DIR/calls" 2>/dev/null || echo 0) + 1 ))
echo "$calls" > "$SHIM_DIR/calls"
if [ "$calls" -eq "$HANG_AT" ]; then exec "$SHIM_PYTHON" -c "$SHIM_HANG" "$SHIM_DIR/hung"; fi
printf '%s\\n' "$out"
"""


def hanging_sbatch(folder: Path, hang_at: int) -> Dict[str, str]:
    """The environment that puts the hanging sbatch first on PATH (its marker: `folder`/hung)."""
    folder.mkdir(parents=True)
    shim = folder / "sbatch"
    shim.write_text(HANGING_SBATCH)
    shim.chmod(0o755)
    real = shutil.which("sbatch")
    assert real
    return {
        "PATH": f"{folder}{os.pathsep}{os.environ['PATH']}",
        "REAL_SBATCH": real,
        "SHIM_DIR": str(folder),
        "HANG_AT": str(hang_at),
        "SHIM_PYTHON": sys.executable,
        "SHIM_HANG": HANG,
    }


def start(command: List[str], cwd: Path = REPO, env: Optional[Dict[str, str]] = None) -> subprocess.Popen:
    """The command in its own process group, as a terminal starts it (CPU only, output captured)."""
    return subprocess.Popen(
        command,
        cwd=cwd,
        env=dict(os.environ, CUDA_VISIBLE_DEVICES="", **(env or {})),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )


def ctrl_c(proc: subprocess.Popen) -> str:
    """SIGINT to the whole group (the command and its sbatch), then what it printed."""
    os.killpg(proc.pid, signal.SIGINT)
    out, _ = proc.communicate(timeout=120)
    return out


def jobs_named(name: str, states: str = "PENDING,RUNNING,CONFIGURING,COMPLETING,SUSPENDED") -> Dict[str, str]:
    """This test's jobs (by their unique name) that the controller knows, id -> state."""
    out = subprocess.run(
        ["squeue", "--me", "-h", "-r", "-n", name, "-t", states, "-o", "%i %T"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return dict(line.split() for line in out.splitlines() if line.strip())


def cancelled_count(name: str) -> int:
    """How many of the command's jobs the controller holds, once none is left queued; all of them CANCELLED."""
    wait_for(lambda: not jobs_named(name), 10, f"no job named {name} left queued")
    states = jobs_named(name, "all")
    assert set(states.values()) <= {"CANCELLED"}, states
    return len(states)


def check_one_line(out: str, proc: subprocess.Popen) -> re.Match:
    """Exit code 130, no traceback, one line that says what happened."""
    assert proc.returncode == 130, out
    assert "Traceback" not in out and "KeyboardInterrupt" not in out, out
    lines = [line for line in out.splitlines() if MESSAGE.match(line)]
    assert len(lines) == 1, out
    return MESSAGE.match(lines[0])  # type: ignore[return-value]


def ctrl_c_at_the_hanging_sbatch(proc: subprocess.Popen, shim: Path, check: Callable[[], bool] = lambda: True):
    """Once the stand-in sbatch hangs (Slurm made its job), Ctrl-C to the group; the one line it printed."""
    wait_for(lambda: (shim / "hung").exists() or proc.poll() is not None, 120, "the hanging sbatch")
    assert proc.poll() is None, proc.communicate()[0]
    assert check()
    return check_one_line(ctrl_c(proc), proc)


def cancel_leftovers(name: str) -> None:
    subprocess.run(["scancel", "--me", "-n", name], capture_output=True)


def test_ctrl_c_part_way_through_a_sweep_cancels_what_it_queued(slurm_cluster, tmp_path):
    """30 jobs of 30 time limits (30 sbatch calls), Ctrl-C once 8 are queued: all of them cancelled, one line."""
    name = f"intr-{uuid.uuid4().hex[:8]}"
    sweep_dir = tmp_path / "sweep"
    times = ",".join(str(minutes) for minutes in range(1, 31))
    command = [
        sys.executable,
        "-m",
        "hpc_train.cli",
        "-m",
        *HELD,
        f"job_name={name}",
        f"resources.time={times}",
        f"hydra.sweep.dir={sweep_dir}",
    ]
    proc = start(command)
    try:
        wait_for(lambda: len(jobs_named(name)) >= 8 or proc.poll() is not None, 120, "8 jobs queued")
        seen = len(jobs_named(name))
        out = ctrl_c(proc)
        said = check_one_line(out, proc)
        count = int(re.fullmatch(r"the (\d+) jobs already queued were cancelled", said.group(2)).group(1))
        assert seen <= count < 30
        assert cancelled_count(name) == count  # every job Slurm made, the one sbatch was making included
        assert not (sweep_dir / "slurm").exists() and not (sweep_dir / "jobs.tsv").exists()
    finally:
        cancel_leftovers(name)


def test_a_cut_off_sbatch_whose_job_slurm_made_is_found_and_cancelled(slurm_cluster, tmp_path):
    """A single job: Slurm made it, sbatch was cut off before printing its id; the command cancels it all the same."""
    name = f"intr-{uuid.uuid4().hex[:8]}"
    env = hanging_sbatch(tmp_path / "shim", hang_at=1)
    run_dir = tmp_path / "run"
    proc = start(
        [sys.executable, "-m", "hpc_train.cli", *HELD, f"job_name={name}", f"hydra.run.dir={run_dir}"], env=env
    )
    try:
        said = ctrl_c_at_the_hanging_sbatch(proc, tmp_path / "shim", check=lambda: len(jobs_named(name)) == 1)
        assert said.group(1) == "job" and said.group(2) == "Slurm had queued it, and it was cancelled"
        assert cancelled_count(name) == 1
        assert not (run_dir / "slurm").exists()
    finally:
        cancel_leftovers(name)


def test_a_hydra_apps_sweep_says_the_same(slurm_cluster, tmp_path):
    """hydra/launcher=hpc_train_slurm: the same submission code, the same line and exit code; the 5th sbatch cut off."""
    name = f"intr-{uuid.uuid4().hex[:8]}"
    env = hanging_sbatch(tmp_path / "shim", hang_at=5)
    sweep_dir = tmp_path / "sweep"
    command = [
        sys.executable,
        "my_app.py",
        "-m",
        *APP_HELD,
        f"hydra.launcher.name={name}",
        "hydra.launcher.timeout_min=${gpus}",
        "gpus=range(1,11)",
        f"hydra.sweep.dir={sweep_dir}",
    ]
    proc = start(command, cwd=APP, env=env)
    try:
        said = ctrl_c_at_the_hanging_sbatch(proc, tmp_path / "shim")
        assert said.group(1) == "sweep" and said.group(2) == "the 5 jobs already queued were cancelled"
        assert cancelled_count(name) == 5
        assert not (sweep_dir / ".submitit").exists()  # submitit's folder (%j and all), taken back whole
    finally:
        cancel_leftovers(name)


def test_ctrl_c_while_waiting_for_a_job_stops_the_wait_not_the_job(slurm_cluster, tmp_path):
    """launcher.wait=true, Ctrl-C once the job is queued: one line naming the job, exit 130; the job stays queued."""
    name = f"intr-{uuid.uuid4().hex[:8]}"
    run_dir = tmp_path / "run"
    command = [
        sys.executable,
        "-m",
        "hpc_train.cli",
        *HELD,
        "launcher.wait=true",
        f"job_name={name}",
        f"hydra.run.dir={run_dir}",
    ]
    proc = start(command)
    try:
        wait_for(lambda: len(jobs_named(name)) == 1 or proc.poll() is not None, 120, "the job queued")
        time.sleep(1)  # past the submission, into the wait
        out = ctrl_c(proc)
        [job] = jobs_named(name)
        lines = [line for line in out.splitlines() if line.startswith("hpc-train: stopped waiting")]
        assert proc.returncode == 130 and "Traceback" not in out and "KeyboardInterrupt" not in out, out
        assert lines == [
            f"hpc-train: stopped waiting (Ctrl-C); Slurm job {job} goes on. Watch it with"
            f" hpc-train-report {run_dir} --watch, or stop it with scancel {job}"
        ], out
    finally:
        cancel_leftovers(name)


def test_ctrl_c_while_the_queued_jobs_are_written_down_cancels_them_all(slurm_cluster, tmp_path, monkeypatch):
    """After the last sbatch, until the job specs and jobs.tsv are written (slurm_queueing.Queueing), Ctrl-C waits for
    the writing to end, then cancels every job: none stays queued that no job table lists."""
    monkeypatch.chdir(REPO)
    name = f"intr-{uuid.uuid4().hex[:8]}"
    cfg = compose([*HELD, f"job_name={name}", "strategy=single", "cluster.time=5"])
    plans = [make_plan(cfg, tmp_path / "sweep" / str(n)) for n in range(3)]
    jobs = [slurm.prepare(plan, build_job_spec(plan, {}), f"n={n}") for n, plan in enumerate(plans)]
    written = False
    try:
        with pytest.raises(slurm_queueing.SubmissionInterrupted) as interrupted:
            with slurm_queueing.Queueing(len(jobs)) as queueing:
                queueing.submitted = slurm.submit_jobs(jobs, log_root=tmp_path / "sweep")
                assert threading.current_thread() is threading.main_thread(), "SIGINT goes to the main thread"
                os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C while the jobs are being written down
                time.sleep(0.2)
                written = True  # the writing goes on to its end
        assert written and "the 3 jobs already queued were cancelled" in str(interrupted.value)
        assert interrupted.value.exit_code == 130
        assert cancelled_count(name) == 3 and not jobs_named(name)
    finally:
        cancel_leftovers(name)


def test_ctrl_c_while_a_big_sweep_is_composed_says_so_in_one_line(slurm_cluster, tmp_path):
    """Before any sbatch (20,000 jobs take seconds to compose and lay out): one line, exit 130, no traceback."""
    command = [
        sys.executable,
        "-m",
        "hpc_train.cli",
        "-m",
        *HELD,
        "dry_run=true",
        "seed=range(0,20000)",
        f"hydra.sweep.dir={tmp_path / 'sweep'}",
    ]
    proc = start(command)
    first = proc.stdout.readline()
    assert first.startswith("hpc-train: composed 1,000 of 20,000 jobs"), first
    out = ctrl_c(proc)
    assert proc.returncode == 130 and out.strip().splitlines() == ["hpc-train: interrupted (Ctrl-C)"], out
