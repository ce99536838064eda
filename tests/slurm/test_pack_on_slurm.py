"""A packed sweep on the Slurm test cluster, as its user follows it: hpc-train-report, --watch, --rerun-failed and the
Python API read each run's state from its allocation's records, name the allocation and rerun only what failed.

24 one-GPU runs of a tiny script, packed into 2 allocations of 1 node x 4 GPUs: 2 Slurm jobs run them all, up to 4
at once in each allocation, overlapping runs on different GPUs. The script fails for x=13 while a marker file lies
beside it; with the marker gone, --rerun-failed runs that one again, alone, in one new allocation.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List

import pytest

import hpc_train
from hpc_train.pack import records
from tests.e2e.test_report import table
from tests.support.cli import assert_ok, run_cli
from tests.support.paths import REPO

pytestmark = pytest.mark.slurm

RUNS, FAILING = 24, 13
PACKED = [
    "launcher=slurm",
    "launcher.pack.gpus_per_node=4",
    "strategy=single",
    "cluster.cpus_per_gpu=1",
    "cluster.time=5",
]
SCRIPT = '''\
"""Records its GPUs, its allocation and its times in its run dir; fails for x={failing} while FAIL lies beside it."""
import json, os, sys, time
from pathlib import Path

x = int(next(arg.split("=", 1)[1] for arg in sys.argv[1:] if arg.startswith("--x=")))
start = time.time()
time.sleep(3)
KEYS = ("CUDA_VISIBLE_DEVICES", "SLURM_STEP_GPUS", "SLURM_JOB_ID", "SLURM_STEP_ID")
seen = {{key: os.environ.get(key) for key in KEYS}}
record = {{**seen, "x": x, "start": start, "end": time.time()}}
Path(os.environ["HPC_TRAIN_RUN_DIR"], "seen.json").write_text(json.dumps(record))
if x == {failing} and Path(__file__).with_name("FAIL").exists():
    sys.exit("told to fail")
'''


def script_in(folder: Path) -> Path:
    script = folder / "job.py"
    script.write_text(SCRIPT.format(failing=FAILING))
    (folder / "FAIL").touch()
    return script


def hpc_train_report(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "hpc_train.report.command", *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=timeout,
    )


def seen(sweep_dir: Path) -> Dict[str, dict]:
    return {p.parent.name: json.loads(p.read_text()) for p in sweep_dir.glob("*/seen.json")}


def peak_overlap(runs: List[dict]) -> int:
    """The most runs that ran at the same moment (from their recorded start and end)."""
    edges = sorted([(r["start"], 1) for r in runs] + [(r["end"], -1) for r in runs])
    now = peak = 0
    for _, step in edges:
        now += step
        peak = max(peak, now)
    return peak


def sacct_steps(allocations: List[str]) -> Dict[str, str]:
    """step id -> step name of the allocations' job steps, once accounting lists them all."""
    deadline = time.monotonic() + 60
    while True:
        out = subprocess.run(
            ["sacct", "-n", "-P", "-j", ",".join(allocations), "-o", "JobID,JobName"], capture_output=True, text=True
        ).stdout
        steps = dict(line.split("|", 1) for line in out.splitlines() if "|" in line)
        named = {step: name for step, name in steps.items() if name.startswith("run")}
        if len(named) >= RUNS or time.monotonic() > deadline:
            return steps


def test_a_packed_sweep_is_reported_watched_and_its_failed_run_rerun(slurm_cluster, tmp_path):
    sweep_dir = tmp_path / "sweep"
    script = script_in(tmp_path)
    x = ",".join(str(i) for i in range(RUNS))
    proc = run_cli(
        [
            "-m",
            *PACKED,
            "launcher.pack.allocations=2",
            f"+script.overrides.x={x}",
            f"hydra.sweep.dir={sweep_dir}",
            "--",
            str(script),
        ],
        gpus=True,
    )
    assert_ok(proc)

    # --watch follows it to its end from the allocations' records: runs running, an ETA, the failure
    watched = hpc_train_report(str(sweep_dir), "--watch", "--every", "1", timeout=300)
    out = watched.stdout
    assert watched.returncode == 1, out + watched.stderr
    final = out.strip().split("hpc-train-report --watch")[-1]
    assert f"{RUNS} jobs: {RUNS - 1} COMPLETED, 1 FAILED" in final, final
    assert re.search(r"running:.*\n\s+\d+\s+\d+:\d+\s", out), out  # a running run by its packed id
    assert "ETA" in out

    plans = records.read_plans(sweep_dir)
    allocations = [str(plan.job_id) for plan in plans]
    owner = {run.job: str(plan.job_id) for plan in plans for run in plan.runs}
    assert len(plans) == 2 and sorted(len(plan.runs) for plan in plans) == [RUNS // 2] * 2
    failed_in = owner[str(FAILING)]
    assert f"#{FAILING} (allocation {failed_in}) FAILED: " in final and "told to fail" in final
    assert f"log: {sweep_dir / str(FAILING) / 'logs' / 'rank0.error.json'}" in final
    assert f"log: {sweep_dir / str(FAILING) / 'slurm' / failed_in}_" in final

    # exactly 2 Slurm jobs ran the 24 runs, each run a job step of its own allocation
    runs = seen(sweep_dir)
    assert len(runs) == RUNS and {r["SLURM_JOB_ID"] for r in runs.values()} == set(allocations)
    assert all(r["SLURM_JOB_ID"] == owner[job] for job, r in runs.items())
    steps = sacct_steps(allocations)
    assert {step.split(".")[0] for step in steps} == set(allocations), steps
    assert sorted(name for name in steps.values() if name.startswith("run")) == sorted(f"run{j}" for j in range(RUNS))
    peaks = [peak_overlap([r for r in runs.values() if r["SLURM_JOB_ID"] == allocation]) for allocation in allocations]
    assert all(2 <= peak <= 4 for peak in peaks) and max(peaks) == 4, peaks  # up to 4 at once on one node's 4 GPUs
    for allocation in allocations:
        mine = [r for r in runs.values() if r["SLURM_JOB_ID"] == allocation]
        for a in mine:
            for b in mine:
                if a is not b and a["start"] < b["end"] and b["start"] < a["end"]:  # they overlapped
                    assert a["CUDA_VISIBLE_DEVICES"] != b["CUDA_VISIBLE_DEVICES"], (a, b)
                    assert a["SLURM_STEP_GPUS"] != b["SLURM_STEP_GPUS"], (a, b)

    # the report: 23 COMPLETED and the failed run, by the allocation that ran it
    report = hpc_train_report(str(sweep_dir), "--no-png")
    assert "states: 23 COMPLETED, 1 FAILED" in report.stdout, report.stdout
    rows = {row["job"]: row for row in table(report.stdout)}
    assert {job: row["allocation"] for job, row in rows.items()} == owner
    assert rows[str(FAILING)]["status"] == "FAILED"
    assert f"#{FAILING} (allocation {failed_in}) FAILED: " in report.stdout

    # --rerun-failed: only that run, in one new allocation of the same shape, which it completes this time
    (tmp_path / "FAIL").unlink()
    rerun = hpc_train_report(str(sweep_dir), "--rerun-failed")
    assert rerun.returncode == 0 and "1 job(s) resubmitted" in rerun.stdout, rerun.stdout + rerun.stderr
    plans = records.read_plans(sweep_dir)
    new = plans[-1]
    assert len(plans) == 3 and new.index == 2 and [run.job for run in new.runs] == [str(FAILING)]
    assert (new.nodes, new.gpus_per_node) == (plans[0].nodes, plans[0].gpus_per_node) == (1, 4)
    newest = (sweep_dir / "jobs.tsv").read_text().splitlines()[-1].split("\t")
    assert newest[:2] == [records.packed_id(str(new.job_id), str(FAILING)), str(FAILING)]
    watched = hpc_train_report(str(sweep_dir), "--watch", "--every", "1", timeout=180)
    assert watched.returncode == 0, watched.stdout + watched.stderr
    report = hpc_train_report(str(sweep_dir), "--no-png")
    assert "states: 24 COMPLETED" in report.stdout, report.stdout
    assert {row["job"]: row["allocation"] for row in table(report.stdout)} == {**owner, str(FAILING): str(new.job_id)}
    assert seen(sweep_dir)[str(FAILING)]["SLURM_JOB_ID"] == str(new.job_id)
    assert len({r["SLURM_JOB_ID"] for r in seen(sweep_dir).values()}) == 3  # nothing else ran again


def test_the_python_apis_jobs_of_a_packed_sweep(slurm_cluster, tmp_path):
    script = script_in(tmp_path)
    # the allocation asks for its GPUs with --gpus-per-node, each run's step for its own with --gres
    flag = ["cluster.gpu_flag=gpus-per-node"]
    jobs = hpc_train.sweep(
        [
            *PACKED,
            *flag,
            "launcher.pack.allocations=1",
            f"script.argv=['{script}']",
            f"+script.overrides.x=0,{FAILING}",
        ],
        sweep_dir=tmp_path / "sweep",
    )
    allocation = str(records.read_plans(tmp_path / "sweep")[0].job_id)
    assert "#SBATCH --gpus-per-node=4\n" in records.plan_path(tmp_path / "sweep", 0).with_suffix(".sh").read_text()
    assert [job.job_id for job in jobs] == [f"{allocation}:0", f"{allocation}:1"]
    states = [job.state() for job in jobs]
    assert all(state in ("WAITING", "RUNNING", "COMPLETED", "FAILED") for state in states), states
    assert (
        jobs[0]._watch.ref.shared_states is jobs[1]._watch.ref.shared_states
    )  # one reading of the records for the sweep's jobs
    summary = jobs[0].wait(timeout=180)
    assert summary["script"][-1] == "--x=0" and jobs[0].state() == "COMPLETED"
    with pytest.raises(hpc_train.JobFailed, match="told to fail") as failed:
        jobs[1].wait(timeout=180)
    assert f"job {allocation}:1 FAILED" in str(failed.value) and jobs[1].state() == "FAILED"
    with pytest.raises(ValueError, match=f"scancel {allocation}"):
        jobs[0].cancel()
