"""Sweep dirs: a sweep's dry run leaves none behind (hpc-train's own and a Hydra app's, on a laptop without Slurm),
and neither a dry run nor a sweep refused for its sweep dir changes anything of a sweep dir it finds.

Every command runs with only this Python's bin dir on PATH (no sbatch, srun or sinfo, as on a laptop) and in a
temporary working directory, so Hydra's default ``multirun/<date>/<time>`` lands there. The Hydra app is
tests/support/scripts/plain_app, its jobs run here by ``hydra/launcher=hpc_train_local`` (one process each). A sweep
refused for jobs of another sweep that are still queued, on Slurm: tests/slurm/test_sweep_dir_taken.py.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List

import pytest
import yaml

from hpc_train.jobs import job_table
from tests.support.cli import TINY, run_cli, wait_for
from tests.support.paths import SCRIPTS

NO_SLURM = {**os.environ, "PATH": str(Path(sys.executable).parent), "CUDA_VISIBLE_DEVICES": ""}  # no sbatch, no sinfo
APP = SCRIPTS / "plain_app" / "my_app.py"
APP_ON_SLURM = ["hydra/launcher=hpc_train_slurm", "hydra.launcher.dry_run=true", "hydra.launcher.cpus_per_task=1"]
PACKED = ["hydra.launcher.pack.allocations=1", "hydra.launcher.pack.gpus_per_node=2"]


def app_sweep(cwd: Path, *words: str) -> subprocess.CompletedProcess:
    command = [sys.executable, str(APP), "-m", *words]
    return subprocess.run(
        command, cwd=cwd, capture_output=True, text=True, timeout=120, env={**NO_SLURM, "HOME": str(cwd)}
    )


def files(folder: Path) -> Dict[str, bytes]:
    """Every file under `folder` with its bytes."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def assert_ok(proc: subprocess.CompletedProcess) -> None:
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0 and "Traceback" not in out, out


@pytest.mark.parametrize("packed", [[], PACKED], ids=["arrays", "packed"])
def test_a_hydra_apps_dry_run_on_a_laptop_prints_the_jobs_and_leaves_no_sweep_dir(tmp_path, packed):
    proc = app_sweep(tmp_path, *APP_ON_SLURM, *packed, "gpus=1,2")
    assert_ok(proc)
    assert "#0 gpus=1: 1 node(s) x 1 task(s), cpus_per_task 1" in proc.stdout, proc.stdout
    assert ("# allocation 0: 1 node(s) x 2 CPUs, no GPU" in proc.stdout) == bool(packed), proc.stdout
    assert list(tmp_path.iterdir()) == [], list(tmp_path.rglob("*"))


OWN_LAUNCHERS = {
    "slurm": ["launcher=slurm"],
    "packed": ["launcher=slurm", "launcher.pack.allocations=1", "launcher.pack.gpus_per_node=2"],
    "local": [],  # the jobs run here, each a dry run: no run dir is left either
}


@pytest.mark.parametrize("launcher", list(OWN_LAUNCHERS))
def test_hpc_trains_sweep_dry_run_leaves_no_sweep_dir(tmp_path, launcher):
    words = [
        "-m",
        *OWN_LAUNCHERS[launcher],
        "strategy=single",
        "model=toy_mlp",
        "data=synthetic",
        "dry_run=true",
        "seed=1,2",
    ]
    proc = run_cli(words, cwd=tmp_path, env=NO_SLURM)
    assert_ok(proc)
    assert "seed=2" in proc.stdout, proc.stdout  # each job said
    assert list(tmp_path.iterdir()) == [], list(tmp_path.rglob("*"))


def test_a_sweep_refused_for_its_sweep_dir_and_a_dry_run_into_it_change_nothing_there(tmp_path):
    """The sweep dir of an ended sweep: a sweep of other overrides is refused (its jobs would take the earlier runs'
    dirs) before Hydra's multirun.yaml or the sweep's status is rewritten for good; the same sweep's dry run (on
    Slurm, from a laptop) reads the sweep dir and leaves it as it was, its pickled tasks included."""
    sweep_dir = tmp_path / "sweep"
    local: List[str] = [
        "hydra/launcher=hpc_train_local",
        "hydra.launcher.timeout_min=2",
        f"hydra.sweep.dir={sweep_dir}",
    ]
    first = app_sweep(tmp_path, *local, "gpus=1,2")
    assert_ok(first)
    before = files(sweep_dir)
    assert {"multirun.yaml", ".hpc_train/sweep.json", "jobs.tsv", "1/seen.json"} <= set(before), sorted(before)

    other = app_sweep(tmp_path, *local, "gpus=3,4")
    assert other.returncode == 2 and "Traceback" not in other.stderr, other.stdout + other.stderr
    assert "holds job #0 of an earlier sweep (gpus=1" in other.stderr, other.stderr
    assert files(sweep_dir) == before

    dry = app_sweep(tmp_path, *APP_ON_SLURM, f"hydra.sweep.dir={sweep_dir}", "gpus=1,2")
    assert_ok(dry)
    assert "#1 gpus=2: 1 node(s) x 1 task(s)" in dry.stdout, dry.stdout
    assert files(sweep_dir) == before


def test_a_local_sweeps_jobs_record_their_own_overrides_and_its_sweep_dir_is_kept_for_it(tmp_path):
    """hpc-train's local sweep (no job table): each job's .hydra/overrides.yaml holds all of its overrides (its swept
    value too), as Hydra's own launcher writes them; the same sweep's dry run into that sweep dir goes on and writes
    nothing there, a sweep of other overrides is refused before anything runs, and changes nothing there either."""
    sweep_dir = tmp_path / "sweep"
    words = [
        "-m",
        *TINY,
        "strategy=single",
        "trainer.max_steps=2",
        "trainer.epochs=null",
        f"hydra.sweep.dir={sweep_dir}",
    ]
    assert_ok(run_cli([*words, "seed=1,2"], cwd=tmp_path, env=NO_SLURM))
    for job, seed in (("0", 1), ("1", 2)):
        recorded = yaml.safe_load((sweep_dir / job / ".hydra" / "overrides.yaml").read_text())
        assert f"seed={seed}" in recorded and "trainer.max_steps=2" in recorded, recorded
    before = files(sweep_dir)
    dry = run_cli([*words, "seed=1,2", "dry_run=true"], cwd=tmp_path, env=NO_SLURM)
    assert_ok(dry)
    assert f"run dir: {sweep_dir / '1'}" in dry.stdout, dry.stdout
    assert files(sweep_dir) == before
    other = run_cli([*words, "seed=3,4"], cwd=tmp_path, env=NO_SLURM)
    assert other.returncode == 2 and "Traceback" not in other.stderr, other.stdout + other.stderr
    assert "holds job #0 of an earlier sweep (" in other.stderr and f"whose run dir {sweep_dir / '0'}" in other.stderr
    assert "seed=1" in other.stderr and "Nothing was run" in other.stderr and "hpc-train: sweep job" not in other.stdout
    assert files(sweep_dir) == before


def test_a_sweep_into_the_sweep_dir_of_a_local_sweep_at_work_is_refused(tmp_path):
    """A local sweep keeps no job table: its launcher, still running on this host, holds the sweep dir."""
    sweep_dir = tmp_path / "sweep"
    words = [
        "-m",
        *TINY,
        "strategy=single",
        "trainer.max_steps=50",
        "trainer.epochs=null",
        f"hydra.sweep.dir={sweep_dir}",
    ]
    command = [sys.executable, "-m", "hpc_train.cli", *words, "seed=1,2"]
    slow = {**NO_SLURM, "HPC_TRAIN_STEP_SLEEP": "0.5"}  # 50 steps: 25 s at least, the launcher at work meanwhile
    first = subprocess.Popen(
        command, cwd=tmp_path, env=slow, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )
    try:
        wait_for(lambda: (sweep_dir / "0" / "metrics.jsonl").exists(), 120, "the first sweep's job #0 to train")
        before = files(sweep_dir / ".hpc_train")
        again = run_cli([*words, "seed=1,2"], cwd=tmp_path, env=NO_SLURM)  # even the same sweep: its runs are busy
    finally:
        os.killpg(first.pid, signal.SIGKILL)
        first.wait(timeout=30)
    assert again.returncode == 2 and "Traceback" not in again.stderr, again.stdout + again.stderr
    assert f"is in use by a sweep whose launcher still runs (pid {first.pid} on this host)" in again.stderr
    assert f"kill -INT {first.pid}" in again.stderr and "Nothing was run" in again.stderr
    assert files(sweep_dir / ".hpc_train") == before


def test_sweeps_started_in_the_same_second_get_sweep_dirs_of_their_own(tmp_path):
    """A sweep dir named by the clock is made for one command: <time>-1, -2, ... when another took that second. The
    clock's pattern here is the year, so "the same second" holds for commands run one after the other."""
    year = time.strftime("%Y")
    by_year = ["hydra/launcher=hpc_train_local", "hydra.launcher.timeout_min=2", "hydra.sweep.dir=multi/${now:%Y}"]
    assert_ok(app_sweep(tmp_path, *by_year, "gpus=1,2"))
    first = files(tmp_path / "multi" / year)
    second = app_sweep(tmp_path, *by_year, "gpus=3,4")  # its own sweep dir, not the first's (taken: refused)
    assert_ok(second)
    assert f"multi/{year}-1/jobs.tsv" in second.stdout, second.stdout
    assert [row.overrides for row in job_table.read(tmp_path / "multi" / f"{year}-1")] == ["gpus=3", "gpus=4"]
    assert (tmp_path / "multi" / f"{year}-1" / "0" / "seen.json").exists()
    dry = app_sweep(tmp_path, *APP_ON_SLURM, "hydra.sweep.dir=multi/${now:%Y}", "gpus=5")
    assert_ok(dry)
    assert sorted(p.name for p in (tmp_path / "multi").iterdir()) == [year, f"{year}-1"]  # the dry run's -2 is gone
    assert files(tmp_path / "multi" / year) == first
