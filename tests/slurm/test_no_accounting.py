"""Job states on a Slurm cluster whose accounting does not answer, on the real Slurm test cluster.

Some sites give users no ``sacct``, or run without accounting. The reading side gets a copy of
the cluster's slurm.conf with ``AccountingStorageType=accounting_storage/none`` (``SLURM_CONF``):
Slurm's own ``sacct`` then refuses ("Slurm accounting storage is disabled") while ``squeue`` still
talks to the same controller. The daemons keep their accounting, so the same sweeps read with
the cluster's own config give Slurm's states to compare with. Three sweeps: hpc_train's trainer
and a user's script, each with a job that completes, one that fails and one cancelled while it
runs; and one job cancelled before it started, which leaves nothing.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import pytest

from hpc_train.api import Job
from hpc_train.jobs.job_states import FROM_RUN_DIRS, NO_RECORD
from tests.e2e.test_report import report, table
from tests.support.cli import TINY, assert_ok, run_cli, wait_for
from tests.support.paths import REPO

pytestmark = pytest.mark.slurm

SLURM = ["launcher=slurm", "cluster.cpus_per_gpu=1", "cluster.time=5", "strategy=single", "resources.gpus_per_node=1"]
# Job 1 fails after 5 steps (HPC_TRAIN_FAIL_AT); job 2 would train for minutes: it is cancelled once it has a step.
# The fault is every job's (one environment for the sweep): job 2 is cancelled as soon as it has a step, and a step
# of 1 s leaves the cancel 4 s to land before job 2's own step 5, on a loaded machine too.
NATIVE = [*TINY, "trainer.max_steps=4,6,400", "trainer.log_every=1", "trainer.eval=false"]
NATIVE_ENV = {"HPC_TRAIN_FAIL_AT": "0:5", "HPC_TRAIN_STEP_SLEEP": "1.0"}
SCRIPT = ["+script.overrides.end=complete,fail,wait", "--", "tests/support/scripts/ends_as_told.py"]
ENDS = ["COMPLETED", "FAILED", "CANCELLED"]


@pytest.fixture(scope="module")
def accounting_off(slurm_cluster, tmp_path_factory) -> Dict[str, str]:
    """The environment of a login node whose slurm.conf says the cluster keeps no accounting."""
    conf = tmp_path_factory.mktemp("no_accounting") / "slurm.conf"
    lines = Path(os.environ["SLURM_CONF"]).read_text().splitlines()
    kept = [line for line in lines if not line.startswith("AccountingStorageType=")]
    conf.write_text("\n".join([*kept, "AccountingStorageType=accounting_storage/none", ""]))
    env = dict(os.environ, SLURM_CONF=str(conf))
    sacct = subprocess.run(["sacct", "-n", "-X"], capture_output=True, text=True, env=env)
    assert sacct.returncode != 0 and "accounting storage is disabled" in sacct.stderr, sacct
    assert subprocess.run(["squeue", "-h"], capture_output=True, env=env).returncode == 0
    return env


def job_ids(sweep_dir: Path) -> List[str]:
    return [line.split("\t")[0] for line in (sweep_dir / "jobs.tsv").read_text().splitlines()[1:]]


def submit(sweep_dir: Path, args: List[str], env: Dict[str, str] = None) -> List[str]:
    """`hpc-train -m` on Slurm; the sweep dir goes before a script's `--` (everything after it is the script's)."""
    split = args.index("--") if "--" in args else len(args)
    assert_ok(run_cli(["-m", *SLURM, *args[:split], f"hydra.sweep.dir={sweep_dir}", *args[split:]], env=env))
    return job_ids(sweep_dir)


def queued(ids: List[str]) -> List[str]:
    """The jobs among `ids` that squeue still lists (pending, running, completing)."""
    out = subprocess.run(["squeue", "-h", "-r", "-o", "%i", "-j", ",".join(ids)], capture_output=True, text=True)
    return [job for job in out.stdout.split() if job in ids]


def states(sweep_dir: Path, env: Dict[str, str]) -> subprocess.CompletedProcess:
    proc = report(str(sweep_dir), "--no-png", env=env)
    assert_ok(proc)
    return proc


def statuses(proc: subprocess.CompletedProcess) -> List[str]:
    return [row["status"] for row in table(proc.stdout)]


def test_states_come_from_the_run_dirs_when_accounting_does_not_answer(accounting_off, tmp_path, monkeypatch):
    native, script, held = tmp_path / "native", tmp_path / "script", tmp_path / "held"
    everyone: List[str] = []
    watch = None
    try:
        script_ids = submit(script, SCRIPT)
        everyone += script_ids
        held_ids = submit(held, ["+cluster.extra.hold=true", "+script.overrides.end=complete", *SCRIPT[1:]])
        everyone += held_ids
        subprocess.run(["scancel", *held_ids], check=True)  # never started: leaves nothing in its run dir
        # The native sweep last: nothing but the watch's start stands between its job 2's first step and the cancel
        # (a submission takes seconds on a loaded machine, as long as job 2's way to its step 5).
        native_ids = submit(native, NATIVE, env=dict(os.environ, **NATIVE_ENV))
        everyone += native_ids
        watch = subprocess.Popen(
            [sys.executable, "-m", "hpc_train.report.command", str(native), "--watch", "--every", "1"],
            cwd=REPO,
            env=accounting_off,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        metrics = native / "2" / "metrics.jsonl"
        wait_for(lambda: metrics.exists() and '"train"' in metrics.read_text(), 90, "a step of native job 2")
        subprocess.run(["scancel", native_ids[2]], check=True)  # at once: it would fail at its step 5 (the fault)
        wait_for(lambda: (script / "2" / "started").exists(), 90, "script job 2 to start")
        subprocess.run(["scancel", script_ids[2]], check=True)
        wait_for(lambda: not queued(everyone), 90, "every job to leave squeue")
        out, _ = watch.communicate(timeout=30)  # --watch ends once every job has ended
    finally:
        subprocess.run(["scancel", *everyone], capture_output=True)
        if watch is not None:
            watch.kill()

    final = out.strip().split("hpc-train-report --watch")[-1]
    assert watch.returncode == 1 and "3 jobs: 1 COMPLETED, 1 CANCELLED, 1 FAILED" in final, out
    assert FROM_RUN_DIRS in final and "InjectedFailure" in final, final

    # Slurm's accounting, read with the cluster's own config: what the run dirs must agree with.
    assert statuses(states(native, os.environ)) == ENDS
    assert statuses(states(script, os.environ)) == ENDS
    assert statuses(states(held, os.environ)) == ["CANCELLED"]

    off = states(native, accounting_off)
    assert statuses(off) == ENDS and off.stdout.count(FROM_RUN_DIRS) == 1, off.stdout
    assert (
        f"#1 {native_ids[1]} FAILED: InjectedFailure: HPC_TRAIN_FAIL_AT=0:5: rank 0 fails after 5 steps" in off.stdout
    )
    off = states(script, accounting_off)
    assert statuses(off) == ENDS and off.stdout.count(FROM_RUN_DIRS) == 1, off.stdout
    failed = next(line for line in off.stdout.splitlines() if line.startswith(f"  #1 {script_ids[1]} FAILED: "))
    assert "RuntimeError: ends_as_told was told to fail" in failed, failed
    off = states(held, accounting_off)
    assert statuses(off) == [NO_RECORD] and "it never started" in off.stdout, off.stdout
    rows = json.loads(report(str(native), "--json", "--no-png", env=accounting_off).stdout)
    assert [(r["slurm_state"], r["state_from_run_dir"]) for r in rows] == [(state, True) for state in ENDS]

    # hpc_train.Job.state() reads the same states
    monkeypatch.setenv("SLURM_CONF", accounting_off["SLURM_CONF"])
    jobs = [Job(job, native / str(n), "slurm") for n, job in enumerate(native_ids)]
    assert [job.state() for job in jobs] == ENDS
    assert Job(held_ids[0], held / "0", "slurm").state() == NO_RECORD

    # --rerun-failed resubmits what the run dirs say did not complete (the new jobs are cancelled at once)
    rerun = report(str(native), "--rerun-failed", "--no-png", env=accounting_off)
    resubmitted = re.findall(r"job #(\d) \(.*?\): (\w+) as \S+, resubmitted as (\S+)", rerun.stdout)
    subprocess.run(["scancel", *(job for _, _, job in resubmitted)], capture_output=True)
    assert [(number, state) for number, state, _ in resubmitted] == [("1", "FAILED"), ("2", "CANCELLED")], rerun.stdout


# Job 0 is requeued from outside (what a preemption with PreemptMode=REQUEUE does) while it runs; its second attempt
# runs to the end. The training's steps are slow on a first attempt only (HPC_TRAIN_STEP_SLEEP), the script sleeps.
REQUEUED = {
    "training": (
        [*TINY, "trainer.max_steps=6", "trainer.log_every=1", "trainer.eval=false", "trainer.lr=0.1,0.05"],
        {"HPC_TRAIN_STEP_SLEEP": "1.0"},
    ),
    "script": (["+script.overrides.sleep=6,1", "--", "tests/support/scripts/ends_as_told.py"], {}),
}


@pytest.fixture(scope="module")
def requeued_sweeps(accounting_off, tmp_path_factory) -> Dict[str, Tuple[Path, str, int, str]]:
    """Both sweeps of REQUEUED under launcher.wait, side by side (one requeue's time, not two): each one's job 0
    requeued once it runs; (sweep dir, job 0's Slurm id, the CLI's exit code, what it printed) by name."""
    folder = tmp_path_factory.mktemp("requeued")
    clis: Dict[str, subprocess.Popen] = {}
    try:
        for what, (args, extra) in sorted(REQUEUED.items()):
            split = args.index("--") if "--" in args else len(args)
            sweep = [*SLURM, "launcher.wait=true", *args[:split], f"hydra.sweep.dir={folder / what}", *args[split:]]
            command = [sys.executable, "-m", "hpc_train.cli", "-m", *sweep]
            env = dict(accounting_off, CUDA_VISIBLE_DEVICES="", **extra)
            clis[what] = subprocess.Popen(
                command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
            )
        running = dict.fromkeys(clis)
        wait_for(lambda: requeue_a_running_job_0(folder, running), 120, "job 0 of each sweep to run")
        said = {what: cli.communicate(timeout=300)[0] for what, cli in clis.items()}
        return {what: (folder / what, running[what], cli.returncode, said[what]) for what, cli in clis.items()}
    finally:
        for cli in clis.values():
            cli.kill()


def requeue_a_running_job_0(folder: Path, running: Dict[str, Optional[str]]) -> bool:
    """`scontrol requeue` job 0 of each sweep in `running` (by name) once it runs, its id noted there; all done?"""
    for what in [what for what, job in running.items() if job is None]:
        started = folder / what / "0" / ("metrics.jsonl" if what == "training" else "started")
        if started.exists() and (what == "script" or '"train"' in started.read_text()):
            running[what] = job_ids(folder / what)[0]
            subprocess.run(["scontrol", "requeue", running[what]], check=True)
    return None not in running.values()


@pytest.mark.parametrize("what", sorted(REQUEUED))
def test_a_job_requeued_from_outside_is_followed_to_the_end_of_its_last_attempt(requeued_sweeps, what):
    """launcher.wait on a cluster without accounting: the requeued job's end is its last attempt's (not the stopped
    attempt's result), said in one line; submitit's sacct warnings never reach the terminal."""
    sweep_dir, first, returncode, out = requeued_sweeps[what]
    assert returncode == 0, out
    lines = out.strip().splitlines()
    assert [line for line in lines if "was requeued" in line] == [
        f"hpc-train: job {first} was requeued by Slurm (attempt 2); following it to the end of its last attempt"
    ], out
    said_sacct = [line for line in lines if "sacct" in line and line != f"hpc-train: {FROM_RUN_DIRS}"]
    assert "failed" not in out and not said_sacct and "storage is disabled" not in out, out  # submitit's warnings
    assert sum("accounting" in line for line in lines) <= 1, out
    if what == "training":
        assert out.count("hpc-train: done: 6 steps") == 2, out
    else:
        assert "finished (attempt 2)" in out and "finished (attempt 1)" in out, out
    assert lines[-1].startswith("hpc-train: sweep of 2 job(s) ended: 2 completed"), lines[-1]
    # Slurm's accounting (the cluster's own config) agrees: both completed, job 0 in two attempts
    assert statuses(states(sweep_dir, os.environ)) == ["COMPLETED", "COMPLETED"]
    assert json.loads((sweep_dir / "0" / "summary.json").read_text())["attempts"] == 2
