"""A second sweep into a sweep dir another sweep's runs hold, on the Slurm test cluster: refused before anything is
queued (exit code 2, one message naming the live jobs and the fixes), for hpc-train's own sweeps (arrays and packed)
and a Hydra app's; once those jobs have ended, a sweep of other overrides is still refused (their run dirs hold those
runs' records), while the same sweep again goes on. The first sweep's jobs are held (``hold``: queued, using no CPU)
and cancelled at the end. (From a laptop: tests/slurm/test_from_laptop.py.)"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import List

import pytest

from hpc_train.jobs import job_table
from tests.support.cli import run_cli

pytestmark = pytest.mark.slurm

HELD = [
    "launcher=slurm",
    "cluster=slurm",
    "strategy=single",
    "model=toy_mlp",
    "data=synthetic",
    "trainer.max_steps=5",
    "cluster.cpus_per_gpu=1",
    "+cluster.extra.hold=true",
]


def queued(name: str) -> List[str]:
    """The ids of this test's jobs in the queue (each array task on its own); `name`: job names, comma-separated."""
    out = subprocess.run(["squeue", "-h", "-r", "-n", name, "-o", "%i"], capture_output=True, text=True).stdout
    return sorted(out.split())


def cancel(name: str) -> None:
    """This test's jobs cancelled: those named `name`, and its allocations' (a second sweep's, were it queued)."""
    names = ",".join([name, f"{name}-pack0", f"{name}-pack1"])
    for one in names.split(","):  # scancel takes one name at a time
        subprocess.run(["scancel", "-n", one], capture_output=True)
    deadline = time.monotonic() + 60
    while queued(names) and time.monotonic() < deadline:
        time.sleep(0.5)


def sweep(sweep_dir: Path, name: str, *words: str):
    return run_cli(["-m", *HELD, f"job_name={name}", f"hydra.sweep.dir={sweep_dir}", *words], None)


def refused_for_live_jobs(proc, sweep_dir: Path, ids: List[str]) -> None:
    """Exit code 2 and one message: the live jobs by id, and the fixes (another sweep dir, wait, scancel)."""
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2 and "Traceback" not in out, out
    assert f"invalid configuration for `hydra.sweep.dir`: the sweep dir {sweep_dir} holds" in out
    assert "live job(s) of another sweep" in out and "Nothing was queued" in out
    assert all(job_id in out for job_id in ids), out
    assert "hydra.sweep.dir=" in out and "--watch" in out and "scancel " in out


def test_a_sweep_into_a_sweep_dir_whose_jobs_are_queued_is_refused_and_after_they_end_only_the_same_sweep_goes_on(
    slurm_cluster, tmp_path
):
    sweep_dir, name = tmp_path / "sweep", f"taken-{uuid.uuid4().hex[:8]}"
    try:
        first = sweep(sweep_dir, name, "seed=1,2")
        assert first.returncode == 0, first.stdout + first.stderr
        ids = queued(name)
        table = (sweep_dir / "jobs.tsv").read_text()
        status = json.loads((sweep_dir / ".hpc_train" / "sweep.json").read_text())
        multirun = (sweep_dir / "multirun.yaml").read_text()  # Hydra's sweeper writes it before the launcher runs
        for seeds in ("seed=3,4", "seed=1,2"):  # another sweep, or the same one again, while the first's are queued
            refused_for_live_jobs(sweep(sweep_dir, name, seeds), sweep_dir, ids)
        assert queued(name) == ids and (sweep_dir / "jobs.tsv").read_text() == table  # nothing queued or recorded
        assert json.loads((sweep_dir / ".hpc_train" / "sweep.json").read_text()) == status  # still the first's
        assert (sweep_dir / "multirun.yaml").read_text() == multirun  # put back: the first sweep's overrides
        assert not (sweep_dir / "0" / "logs").exists()

        cancel(name)  # every job of the sweep dir has ended: a run of other overrides still may not take a run dir
        other = sweep(sweep_dir, name, "seed=3,4")
        out = other.stdout + other.stderr
        assert other.returncode == 2 and "Traceback" not in out, out
        assert "holds job #0 of an earlier sweep (" in out and f"whose run dir {sweep_dir / '0'}" in out
        assert "seed=3)" in out and "--rerun-failed" in out and queued(name) == []
        again = sweep(sweep_dir, name, "seed=1,2")  # the same sweep again: its runs, in their own run dirs
        assert again.returncode == 0, again.stdout + again.stderr
        assert len(queued(name)) == 2
    finally:
        cancel(name)


def test_a_sweep_into_a_packed_sweeps_dir_is_refused_while_its_allocation_is_queued(slurm_cluster, tmp_path):
    sweep_dir, name = tmp_path / "sweep", f"taken-{uuid.uuid4().hex[:8]}"
    packed = ["launcher.pack.allocations=1", "launcher.pack.gpus_per_node=2"]
    try:
        first = sweep(sweep_dir, name, *packed, "seed=1,2")
        assert first.returncode == 0, first.stdout + first.stderr
        (allocation,) = queued(f"{name}-pack0")
        refused_for_live_jobs(sweep(sweep_dir, name, *packed, "seed=3,4"), sweep_dir, [f"{allocation}:0"])
        refused = sweep(sweep_dir, name, "seed=3,4")  # not packed this time: the packed runs are live all the same
        refused_for_live_jobs(refused, sweep_dir, [f"{allocation}:1", f"scancel {allocation}"])
        assert queued(name) == [] and queued(f"{name}-pack0") == [allocation]
        assert [row.job for row in job_table.read(sweep_dir)] == ["0", "1"]
    finally:
        cancel(name)


APP = """\
import hydra


@hydra.main(version_base=None, config_path=".", config_name="config")
def main(cfg) -> int:
    return cfg.x


if __name__ == "__main__":
    main()
"""
APP_HELD = [
    "hydra/launcher=hpc_train_slurm",
    "hydra.launcher.cpus_per_task=1",
    "hydra.launcher.timeout_min=5",
    "hydra.launcher.wait=false",
    "+hydra.launcher.additional_parameters.hold=true",
]


@pytest.mark.parametrize("packed", [False, True])
def test_a_hydra_apps_sweep_into_a_sweep_dir_whose_jobs_are_queued_is_refused(slurm_cluster, tmp_path, packed):
    app = tmp_path / "app"
    app.mkdir()
    (app / "my_app.py").write_text(APP)
    (app / "config.yaml").write_text("x: 0\n")
    sweep_dir, name = tmp_path / "sweep", f"taken-{uuid.uuid4().hex[:8]}"
    words = [*APP_HELD, f"hydra.job.name={name}", f"hydra.sweep.dir={sweep_dir}"]
    words += ["hydra.launcher.pack.allocations=1", "hydra.launcher.pack.gpus_per_node=1"] if packed else []

    def app_sweep(values: str) -> subprocess.CompletedProcess:
        command = [sys.executable, "my_app.py", "-m", *words, f"x={values}"]
        return subprocess.run(command, cwd=app, capture_output=True, text=True, timeout=120)

    queue_name = f"{name}-pack0" if packed else name
    try:
        first = app_sweep("1,2")
        assert first.returncode == 0, first.stdout + first.stderr
        ids = queued(queue_name)
        refused_for_live_jobs(app_sweep("3,4"), sweep_dir, ids)
        assert queued(queue_name) == ids and [row.job for row in job_table.read(sweep_dir)] == ["0", "1"]
    finally:
        cancel(name)
