"""The families of hpc_train.errors that need processes, through the `hpc-train` command and the Python API: a cluster
ssh cannot reach (the user's own ssh, a host name that never resolves) exits 5 and raises Unreachable, not a
ConfigError; a run dir a live job holds raises RunDirRefused; a job whose rank fails exits 1 and raises JobFailed
carrying its run dir and logs. The families called in this process: tests/unit/test_error_families.py."""

from __future__ import annotations

import subprocess
import sys

import pytest

import hpc_train
from hpc_train.records import run_claim, rundir
from hpc_train.remote.settings import RemoteLink, write_link
from tests.support.cli import run_cli
from tests.unit.test_api_without_a_job import JOB, cpu_here  # noqa: F401  (cpu_here: an autouse fixture)

# A Slurm job from a laptop whose cluster.login never resolves (.invalid, RFC 2606): checked here, then ssh fails.
NOWHERE = [
    "launcher=slurm",
    "cluster=slurm",
    "resources.gpus_per_node=1",
    "cluster.cpus_per_gpu=1",
    "cluster.login=nobody@hpc-train-test.invalid",
]


def test_a_cluster_that_cannot_be_reached_exits_5_and_raises_unreachable(tmp_path):
    proc = run_cli([*JOB, *NOWHERE], tmp_path / "cli")
    assert proc.returncode == rundir.EXIT_UNREACHABLE, proc.stdout + proc.stderr
    assert proc.stderr.startswith("hpc-train: cannot reach the cluster (`cluster.login`): nobody@"), proc.stderr
    assert "Traceback" not in proc.stderr and not (tmp_path / "cli").exists()  # refused: no run dir left
    with pytest.raises(hpc_train.Unreachable) as err:
        hpc_train.run([*JOB, *NOWHERE], run_dir=tmp_path / "api", quiet=True)
    assert not isinstance(err.value, hpc_train.ConfigError) and err.value.key == "cluster.login"
    assert isinstance(err.value, hpc_train.HpcTrainError) and "Fix:" in str(err.value)


def test_the_laptops_connect_and_report_exit_5_too_on_a_cluster_that_cannot_be_reached(tmp_path):
    """hpc-train-connect, and hpc-train-report on a run dir whose jobs run on the cluster: Unreachable's exit code
    and its one message, as the hpc-train command."""
    nowhere = NOWHERE[-1].split("=", 1)[1]

    def command(*words: str) -> "subprocess.CompletedProcess[str]":
        return subprocess.run(
            [sys.executable, "-m", *words], capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=120
        )

    connect = command("hpc_train.connect", nowhere)
    assert connect.returncode == rundir.EXIT_UNREACHABLE, connect.stdout + connect.stderr
    assert connect.stderr.startswith("hpc-train: cannot reach the cluster (`cluster.login`): nobody@"), connect.stderr
    write_link(tmp_path / "run", RemoteLink(nowhere, "/home/nobody/run", "python3", []))
    report = command("hpc_train.report.command", str(tmp_path / "run"))
    assert report.returncode == rundir.EXIT_UNREACHABLE, report.stdout + report.stderr
    assert report.stderr.startswith("hpc-train-report: cannot reach the cluster (`cluster.login`)"), report.stderr
    assert "Traceback" not in connect.stderr + report.stderr


def test_a_run_dir_a_live_job_holds_raises_run_dir_refused(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    run_claim.acquire(run_dir, "another-launch")  # held by this process, alive
    with pytest.raises(hpc_train.RunDirRefused, match=f"run dir {run_dir} is in use by"):
        hpc_train.run(JOB, run_dir=run_dir, quiet=True)


def test_a_failed_job_exits_1_and_raises_job_failed_with_its_records(tmp_path, monkeypatch):
    monkeypatch.setenv("HPC_TRAIN_FAIL_AT", "0:2")
    proc = run_cli(JOB, tmp_path / "cli")
    assert proc.returncode == rundir.EXIT_FAILED, proc.stdout + proc.stderr
    with pytest.raises(hpc_train.JobFailed) as err:
        hpc_train.run(JOB, run_dir=tmp_path / "api", quiet=True)
    assert err.value.exit_code == rundir.EXIT_FAILED and isinstance(err.value, hpc_train.HpcTrainError)
    assert err.value.run_dir == tmp_path / "api" and err.value.logs == tmp_path / "api" / rundir.LOGS
    assert err.value.logs.is_dir()
