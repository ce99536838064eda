"""Requests the test cluster can never hold are refused before queueing; sbatch refusals are one message.

The test cluster's nodes declare 16 CPUs, 8000 MB and gpu:4 each; partitions debug (default) and
gpu_p2 have no time limit, `short` has MaxTime=30 minutes (scripts/slurm_test_cluster.sh).
Every refusal must exit 2, name the key and the fix, show no traceback, queue nothing and leave
no job files (job_config.yaml, submitit's pickles and scripts) in the run dir.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from hpc_train.launch.planning import capacity
from hpc_train.slurm import slurm_cli
from tests.support.cli import TINY, assert_ok, read_summary, run_cli
from tests.support.paths import REPO
from tests.support.slurm import wait_for_job_end

pytestmark = pytest.mark.slurm

TRAIN = [*TINY, "trainer.max_steps=4", "trainer.epochs=null", "trainer.batch_size=32"]


def _jobs_named(name: str) -> list:
    """Every job of that name Slurm knows, queued or already ended (squeue, then sacct)."""
    queued = subprocess.run(
        ["squeue", "-h", "-n", name, "-o", "%i"], capture_output=True, text=True, check=True
    ).stdout.split()
    ended = subprocess.run(
        ["sacct", "-n", "-X", "-P", "--name", name, "-S", "now-1hours", "-o", "JobID"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    return queued + ended


def assert_refused(proc: subprocess.CompletedProcess, key: str, fix: str, job_name: str, run_dir: Path) -> None:
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr
    message = proc.stderr.strip().splitlines()
    assert len(message) == 1, f"expected one message, got:\n{proc.stderr}"
    assert f"`{key}`" in message[0] and "Fix:" in message[0] and fix in message[0].split("Fix:", 1)[1], message[0]
    assert _jobs_named(job_name) == [], "nothing may have been queued"
    assert not (run_dir / "job_config.yaml").exists()
    assert not list(run_dir.rglob("*.pkl")) and not list(run_dir.rglob("*submission*"))
    assert not (run_dir / "slurm").exists()


# overrides -> (key named, text of the fix): each over what one node or the partition has
TOO_LARGE = {
    "cpus-per-node": (
        ["cluster.cpus_per_gpu=5"],
        "cluster.cpus_per_gpu",
        "cluster.cpus_per_gpu=4",
    ),  # 4 GPUs x 5 = 20 > 16 CPUs
    "gpus-per-node": (
        ["resources.gpus_per_node=8", "cluster.cpus_per_gpu=1"],
        "resources.gpus_per_node",
        "resources.gpus_per_node=4",
    ),
    "nodes": (
        ["resources.nodes=5", "cluster.cpus_per_gpu=1", "trainer.batch_size=80"],
        "resources.nodes",
        "resources.nodes=4",
    ),
    "memory": (["cluster.mem_gb=9", "cluster.cpus_per_gpu=1"], "cluster.mem_gb", "cluster.mem_gb=7"),
    "time": (
        ["cluster.partition=short", "resources.time=02:00:00", "cluster.cpus_per_gpu=1"],
        "resources.time",
        "resources.time=30",
    ),
    "profile-time": (
        ["cluster.partition=short", "cluster.time=45", "cluster.cpus_per_gpu=1"],
        "cluster.time",
        "cluster.time=30",
    ),
}


@pytest.mark.parametrize("case", list(TOO_LARGE))
def test_requests_larger_than_the_partition_are_refused_before_queueing(case, slurm_cluster, tmp_path):
    overrides, key, fix = TOO_LARGE[case]
    job_name = f"cap-{uuid.uuid4().hex[:8]}"
    run_dir = tmp_path / "run"
    proc = run_cli(["launcher=slurm", *TRAIN, *overrides, f"job_name={job_name}"], run_dir)
    assert_refused(proc, key, fix, job_name, run_dir)


# sbatch options the capacity check does not look at, which Slurm itself refuses
SBATCH_REFUSES = {
    "unknown-option": (["+cluster.extra.no-such-option=1"], "cluster.extra", "cluster.extra"),
    "bad-option-value": (["+cluster.extra.exclusive=bogus"], "cluster.extra", "cluster.extra"),
    "unknown-feature": (["cluster.constraint=no_such_feature"], "cluster.constraint", "cluster.constraint="),
}


@pytest.mark.parametrize("case", list(SBATCH_REFUSES))
def test_sbatch_refusal_is_one_message_and_leaves_no_job_files(case, slurm_cluster, tmp_path):
    overrides, key, fix = SBATCH_REFUSES[case]
    job_name = f"sbr-{uuid.uuid4().hex[:8]}"
    run_dir = tmp_path / "run"
    proc = run_cli(
        [
            "launcher=slurm",
            *TRAIN,
            "cluster.cpus_per_gpu=1",
            "resources.gpus_per_node=2",
            *overrides,
            f"job_name={job_name}",
        ],
        run_dir,
    )
    assert_refused(proc, key, fix, job_name, run_dir)
    assert "Slurm refused the job" in proc.stderr


def test_refused_resubmission_keeps_the_earlier_job_files(slurm_cluster, tmp_path):
    """Re-running into a run dir that already holds a submitted job: a refusal must not touch its files."""
    run_dir = tmp_path / "run"
    base = ["launcher=slurm", *TRAIN, "cluster.cpus_per_gpu=1", "resources.gpus_per_node=2", "cluster.time=5"]
    first = run_cli([*base, "launcher.wait=true"], run_dir)
    assert_ok(first)
    before = sorted(
        p.relative_to(run_dir)
        for p in run_dir.rglob("*")
        if p.is_file() and ".hydra" not in p.parts and p.name != "cli.log"
    )
    spec = (run_dir / "job_config.yaml").read_text()
    again = run_cli([*base, "cluster.constraint=no_such_feature"], run_dir)
    assert again.returncode == 2 and "`cluster.constraint`" in again.stderr, again.stderr
    after = sorted(
        p.relative_to(run_dir)
        for p in run_dir.rglob("*")
        if p.is_file() and ".hydra" not in p.parts and p.name != "cli.log"
    )
    assert after == before
    assert (run_dir / "job_config.yaml").read_text() == spec


def test_sweep_with_one_too_large_job_submits_nothing(slurm_cluster, tmp_path):
    job_name = f"capsw-{uuid.uuid4().hex[:8]}"
    sweep_dir = tmp_path / "sweep"
    proc = run_cli(
        [
            "-m",
            "launcher=slurm",
            *TRAIN,
            "cluster.cpus_per_gpu=1",
            "resources.gpus_per_node=2,8",
            f"job_name={job_name}",
            f"hydra.sweep.dir={sweep_dir}",
        ]
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "`resources.gpus_per_node`" in proc.stderr and "nothing was submitted" in proc.stderr.lower()
    assert "Traceback" not in proc.stdout + proc.stderr
    assert _jobs_named(job_name) == []


def test_readme_default_profile_runs_on_the_test_cluster(slurm_cluster, tmp_path):
    """`hpc-train launcher=slurm` with conf/cluster/slurm.yaml as is (4 GPUs/node, 4 CPUs per GPU): fits a node."""
    run_dir = tmp_path / "run"
    proc = run_cli(["launcher=slurm", *TRAIN, "launcher.wait=true"], run_dir)
    assert_ok(proc)
    job_id = re.search(r"submitted Slurm job (\d+)", proc.stdout).group(1)
    fields = wait_for_job_end(job_id)
    assert fields["JobState"] == "COMPLETED"
    assert fields["NumTasks"] == "4" and fields["NumCPUs"] == "16", fields
    assert read_summary(run_dir)["world_size"] == 4
    assert (run_dir / "job_config.yaml").exists()


def test_parsed_sinfo_agrees_with_scontrol(slurm_cluster):
    """capacity's reading of `sinfo` against `scontrol show node`, node by node."""
    found = capacity.answer.__wrapped__().partitions
    assert found and {"debug", "gpu_p2", "short"} <= set(found)
    assert found["debug"].default and not found["gpu_p2"].default
    assert found["debug"].max_minutes is None and found["short"].max_minutes == 30
    out = subprocess.run(["scontrol", "show", "node", "--oneliner"], capture_output=True, text=True, check=True).stdout
    for line in out.splitlines():
        fields = dict(token.split("=", 1) for token in line.split() if "=" in token)
        node = next(n for n in found["debug"].nodes if n.name == fields["NodeName"])
        assert node.cpus == int(fields["CPUTot"]) and node.mem_mb == int(fields["RealMemory"])
        assert node.gpus == int(re.search(r"gpu:(\d+)", fields["Gres"]).group(1))
        assert node.cores == int(fields["Sockets"]) * int(fields["CoresPerSocket"])


# -- no Slurm configuration on this machine -----------------------------------------------------
NO_CONF = "/nonexistent/slurm.conf"


def _no_conf_env() -> dict:
    return dict(os.environ, SLURM_CONF=NO_CONF)


def _noting_sinfo(tmp_path: Path) -> tuple:
    """A `sinfo` first on a PATH that only notes it ran: (that PATH, the note). What a check that must not wait for
    the real client (it retries a missing SLURM_CONF for 60 s) is about is that it did not run it, not a time."""
    shim, ran = tmp_path / "shim", tmp_path / "sinfo-ran"
    shim.mkdir()
    (shim / "sinfo").write_text(f"#!/bin/sh\ntouch {ran}\nexit 1\n")
    (shim / "sinfo").chmod(0o755)
    return f"{shim}:{os.environ['PATH']}", ran


def test_dry_run_without_a_slurm_configuration_prints_the_layout_and_why_nothing_was_checked(slurm_cluster, tmp_path):
    """The real sinfo with a SLURM_CONF naming no file would wait 60 s: the dry run does not run it."""
    path, ran = _noting_sinfo(tmp_path)
    proc = run_cli(["launcher=slurm", *TRAIN, "dry_run=true"], tmp_path / "run", env=dict(_no_conf_env(), PATH=path))
    assert_ok(proc)
    assert "#SBATCH --nodes=1" in proc.stdout and "hpc-train (dry run, nothing submitted): ddp:" in proc.stdout
    note = [line for line in proc.stderr.splitlines() if "capacity check could not run" in line]
    assert len(note) == 1 and f"SLURM_CONF={NO_CONF} names no configuration file" in note[0], proc.stderr
    assert not ran.exists(), "sinfo was run"


def test_submission_without_a_slurm_configuration_is_one_message_naming_slurm_conf(slurm_cluster, tmp_path):
    job_name = f"noconf-{uuid.uuid4().hex[:8]}"
    run_dir = tmp_path / "run"
    path, ran = _noting_sinfo(tmp_path)
    proc = run_cli(["launcher=slurm", *TRAIN, f"job_name={job_name}"], run_dir, env=dict(_no_conf_env(), PATH=path))
    assert_refused(proc, "launcher", "export SLURM_CONF=", job_name, run_dir)
    assert "find no configuration" in proc.stderr and NO_CONF in proc.stderr
    assert not ran.exists(), "sinfo was run"


def _hidden_default_config() -> list:
    """A command prefix running with the default /etc/slurm hidden (a private mount namespace) and no SLURM_CONF."""
    if os.geteuid() != 0 or shutil.which("unshare") is None or not os.path.exists("/etc/slurm/slurm.conf"):
        pytest.skip("hiding the default slurm.conf needs root, unshare and /etc/slurm/slurm.conf")
    script = 'mount -t tmpfs none /etc/slurm && unset SLURM_CONF && exec "$@"'
    return ["unshare", "-m", "--propagation", "private", "sh", "-c", script, "sh"]


def test_no_default_configuration_and_no_configless_controller_is_the_clients_own_quick_failure(
    slurm_cluster, tmp_path
):
    """Without SLURM_CONF, Slurm's client looks for its default file and then configless sources itself, failing at
    once when none answers; hpc-train reads that failure (it does not look for a file the client may not need)."""
    cli = [*_hidden_default_config(), sys.executable, "-m", "hpc_train.cli", "launcher=slurm", *TRAIN]
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
    dry = subprocess.run(
        [*cli, "dry_run=true", f"hydra.run.dir={tmp_path / 'dry'}"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
        env=env,
    )
    assert_ok(dry)
    assert "hpc-train (dry run, nothing submitted)" in dry.stdout
    assert "capacity check could not run (sinfo: fatal: Could not establish a configuration source)" in dry.stderr
    real = subprocess.run(
        [*cli, f"hydra.run.dir={tmp_path / 'real'}"], capture_output=True, text=True, timeout=60, cwd=REPO, env=env
    )
    assert real.returncode == 2 and "`launcher`" in real.stderr and "configuration source" in real.stderr, real.stderr
    assert len(real.stderr.strip().splitlines()) == 1, real.stderr


def test_what_counts_as_no_configuration(tmp_path, monkeypatch):
    """A SLURM_CONF naming no file is refused without running the command; Slurm's own fatal line is read, and a
    controller that does not answer is not mistaken for a missing configuration."""
    path, ran = _noting_sinfo(tmp_path)
    monkeypatch.setenv("PATH", path)  # the command slurm_cli finds and would run
    done = slurm_cli.run(["sinfo"], env=_no_conf_env())
    assert not ran.exists() and done.returncode == 1 and slurm_cli.unconfigured(done)
    assert slurm_cli.said(done) == f"sinfo was not run: SLURM_CONF={NO_CONF} names no configuration file"
    assert slurm_cli.config_problem({"SLURM_CONF": ""}) and slurm_cli.config_problem({}) is None
    configless = (
        "sinfo: error: resolve_ctls_from_dns_srv: res_nsearch error: Unknown host\nsinfo: error: fetch_config: DNS "
        "SRV lookup failed\nsinfo: fatal: Could not establish a configuration source\n"
    )
    down = "slurm_load_node: Unable to contact slurm controller (connect failure)\n"
    assert slurm_cli.unconfigured(subprocess.CompletedProcess(["sinfo"], 1, "", configless))
    assert (
        slurm_cli.said(subprocess.CompletedProcess(["sinfo"], 1, "", configless))
        == "sinfo: fatal: Could not establish a configuration source"
    )
    assert not slurm_cli.unconfigured(subprocess.CompletedProcess(["sinfo"], 1, "", down))
