"""From a laptop over SSH, on the real Slurm test cluster behind a real OpenSSH server (scripts/ssh_test_server.sh).

The laptop is one user (``hpclaptop``), the cluster's login side another (``hpccluster``): each home is 0700, each
side has its own Python environment, its own working directory, and the laptop has no Slurm configuration. A path
of one side that leaked to the other would not be readable there, so a leak fails the test. Every laptop command
runs as that user with a clean environment (tests.support.ssh_server.as_laptop).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import uuid
from pathlib import Path
from typing import Dict, List

import pytest

from hpc_train.records import run_claim
from hpc_train.records.rundir import EXIT_REFUSED, EXIT_UNREACHABLE
from tests.support.cli import wait_for
from tests.support.paths import REPO
from tests.support.ssh_server import as_laptop, as_laptop_popen, cluster_home, laptop_dir, start_ssh_server

pytestmark = pytest.mark.slurm

TINY = [
    "model=toy_mlp", "data=synthetic", "data.image_size=8", "data.num_samples=64", "trainer.progress=false",
    "trainer.max_steps=4", "trainer.epochs=null", "launcher.signal_delay_s=30",
]  # fmt: skip
PROFILE = "testsite"
TRAIN = '''\
"""A user's script: where it ran, what it was given."""
import json, os, sys
from pathlib import Path
Path("ran.json").write_text(json.dumps({"cwd": os.getcwd(), "argv": sys.argv[1:], "rank": os.environ.get("RANK")}))
print("trained", sys.argv[1:])
'''
FLAKY = '''\
"""Fails while a file FAIL_<x> lies in its folder (the test puts one there on the cluster), then succeeds."""
import sys
from pathlib import Path
x = next(arg.split("=", 1)[1] for arg in sys.argv[1:] if arg.startswith("--x="))
if Path(__file__).with_name(f"FAIL_{x}").exists():
    sys.exit(f"told to fail for x={x}")
print("ok", x)
'''


@pytest.fixture(scope="module")
def laptop(slurm_cluster) -> Dict[str, object]:
    """The test server started; a fresh project on the laptop with a cluster profile naming the cluster."""
    env = start_ssh_server()
    project = laptop_dir(f"proj-{uuid.uuid4().hex[:6]}")
    profile = (REPO / "conf" / "cluster" / "slurm.yaml").read_text()
    profile = re.sub(r"(?m)^name: .*$", f"name: {PROFILE}", profile)
    profile = re.sub(r"(?m)^cpus_per_gpu: .*$", "cpus_per_gpu: 1", profile)
    profile = re.sub(r"(?m)^time: .*$", 'time: "5"', profile)
    profile = re.sub(r"(?m)^login: .*$", f"login: {env['HPC_TRAIN_SSH_ALIAS']}", profile)
    profile = re.sub(r"(?m)^remote_python: .*$", f"remote_python: {env['HPC_TRAIN_SSH_CLUSTER_PYTHON']}", profile)
    files = {
        f"conf/cluster/{PROFILE}.yaml": profile,
        "train.py": TRAIN,
        "flaky.py": FLAKY,
        ".gitignore": "data/\n",
        "data/weights.bin": "not for the cluster",
    }
    for rel, text in files.items():
        (project / rel).parent.mkdir(parents=True, exist_ok=True)
        (project / rel).write_text(text)
    subprocess.run(["chown", "-R", f"{env['HPC_TRAIN_SSH_LAPTOP_USER']}:", str(project)], check=True)
    remote = cluster_home() / "hpc-train" / project.name
    yield {"env": env, "project": project, "remote": remote}
    as_laptop([env["HPC_TRAIN_SSH_LAPTOP_PYTHON"], "-m", "hpc_train.connect", env["HPC_TRAIN_SSH_ALIAS"], "--close"])
    subprocess.run(["scancel", "-u", env["HPC_TRAIN_SSH_CLUSTER_USER"]], capture_output=True)


def cluster_file(laptop, path: Path, text: str, mode: int = 0o644) -> None:
    """A file the cluster's user owns (its folders too, from its home down), as if that user had written it."""
    user = laptop["env"]["HPC_TRAIN_SSH_CLUSTER_USER"]
    home = cluster_home()
    for folder in reversed([*path.relative_to(home).parents][:-1]):
        (home / folder).mkdir(exist_ok=True)
        shutil.chown(home / folder, user, user)
    path.write_text(text)
    path.chmod(mode)
    shutil.chown(path, user, user)


def hpc_train(laptop, *words: str, timeout: float = 600) -> subprocess.CompletedProcess:
    env = laptop["env"]
    command = [env["HPC_TRAIN_SSH_LAPTOP_PYTHON"], "-m", "hpc_train.cli", "--config-dir", "conf", *words]
    return as_laptop(command, cwd=laptop["project"], timeout=timeout)


def report(laptop, *words: str, timeout: float = 300) -> subprocess.CompletedProcess:
    python = laptop["env"]["HPC_TRAIN_SSH_LAPTOP_PYTHON"]
    return as_laptop([python, "-m", "hpc_train.report.command", *words], cwd=laptop["project"], timeout=timeout)


def sacct_user(job_id: str) -> List[str]:
    done = subprocess.run(
        ["sacct", "-n", "-X", "-P", "-j", job_id, "-o", "User,WorkDir,State"], capture_output=True, text=True
    )
    return done.stdout.strip().splitlines()[0].split("|") if done.stdout.strip() else []


def slurm_jobs_of(user: str, name: str) -> List[str]:
    done = subprocess.run(["squeue", "-h", "-u", user, "-n", name, "-o", "%i"], capture_output=True, text=True)
    return done.stdout.split()


def test_a_ddp_job_submitted_followed_and_reported_from_the_laptop(laptop):
    """2 ranks of ddp, followed to its end from the laptop: the cluster's user ran it from its copy of the project,
    the laptop holds its records (not its checkpoints), and the report reads them (and Slurm) over the connection."""
    project, remote = laptop["project"], laptop["remote"]
    done = hpc_train(
        laptop, *TINY, "launcher=slurm", f"cluster={PROFILE}", "strategy=ddp", "resources.gpus_per_node=2",
        "launcher.wait=true", "hydra.run.dir=outputs/ddp",
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert re.search(r"hpc-train: synced .* \(\d+ of \d+ files changed", done.stdout), done.stdout
    assert f"its records here: {project}/outputs/ddp" in done.stdout.splitlines()[-1]
    there = json.loads((remote / "outputs" / "ddp" / "summary.json").read_text())
    here = json.loads((project / "outputs" / "ddp" / "summary.json").read_text())
    assert here == there and here["global_step"] == 4 and here["world_size"] == 2
    assert (remote / "conf" / "cluster" / f"{PROFILE}.yaml").exists()  # the config dir went with the project
    assert (remote / "train.py").exists() and not (remote / "data").exists()  # .gitignore respected
    assert not (project / "outputs" / "ddp" / "checkpoints").exists()  # records only
    job_id = json.loads(report(laptop, "outputs/ddp", "--json", "--no-png").stdout)[0]["slurm_job_id"]
    user, workdir, state = sacct_user(job_id)
    assert (
        user == laptop["env"]["HPC_TRAIN_SSH_CLUSTER_USER"] and workdir.startswith(str(remote)) and state == "COMPLETED"
    )
    shown = report(laptop, "outputs/ddp", "--no-png")
    assert shown.returncode == 0 and "states: 1 COMPLETED" in shown.stdout, shown.stdout + shown.stderr
    fetched = report(laptop, "outputs/ddp", "--fetch", "--no-png")
    assert fetched.returncode == 0 and list((project / "outputs" / "ddp" / "checkpoints").iterdir())


def test_a_sweep_watched_from_the_laptop_and_its_failed_job_rerun(laptop):
    """4 script jobs queued by one forwarded command; --watch follows them from the laptop; the one that failed is
    resubmitted by the cluster's hpc_train from --rerun-failed on the laptop, and completes."""
    remote = laptop["remote"]
    cluster_file(laptop, remote / "FAIL_2", "")
    done = hpc_train(
        laptop, "-m", "launcher=slurm", f"cluster={PROFILE}", "strategy=single", "resources.gpus_per_node=1",
        "hydra.sweep.dir=multirun/flaky", "script.argv=[flaky.py]", "+script.overrides.x=0,1,2,3",
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    sweep = laptop["project"] / "multirun" / "flaky"
    rows = (sweep / "jobs.tsv").read_text().splitlines()[1:]
    assert len(rows) == 4  # the job table came back with the submission
    watched = report(laptop, "multirun/flaky", "--watch", "--every", "2")
    assert watched.returncode == 1, watched.stdout + watched.stderr  # one job failed
    assert "told to fail for x=2" in watched.stdout
    (remote / "FAIL_2").unlink()
    rerun = report(laptop, "multirun/flaky", "--rerun-failed")
    assert rerun.returncode == 0 and "1 job(s) resubmitted" in rerun.stdout, rerun.stdout + rerun.stderr
    watched = report(laptop, "multirun/flaky", "--watch", "--every", "2")
    assert watched.returncode == 0, watched.stdout + watched.stderr
    final = report(laptop, "multirun/flaky", "--no-png")
    assert "states: 4 COMPLETED" in final.stdout, final.stdout


def test_an_adaptive_study_from_the_laptop_runs_its_controller_detached_on_the_cluster(laptop):
    """hydra/sweeper=adaptive with cluster.login: the command goes to the cluster whole, whose hpc-train starts the
    study's controller detached there (a dropped connection or a closed laptop stops nothing) and returns; the study
    ends on the cluster, and the laptop's report reads it."""
    done = hpc_train(
        laptop, "-m", "launcher=slurm", f"cluster={PROFILE}", *TINY, "hydra/sweeper=adaptive",
        "trainer.lr=choice(0.05,0.1)", "hydra.sweeper.sampler=grid", "hydra.sweeper.max_trials=1",
        "hydra.sweeper.scheduler.name=none", "hydra.sweeper.poll_s=0.5", "hydra.sweep.dir=studies/one",
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "the study's controller runs as process" in done.stdout, done.stdout
    study = laptop["remote"] / "studies" / "one"
    claim = run_claim.read(study)
    assert claim is not None and claim.how.startswith("detached") and claim.host == socket.gethostname(), claim
    assert os.getsid(claim.pid) == claim.pid  # a session of its own on the cluster, not the forwarded command's
    wait_for(lambda: not Path(f"/proc/{claim.pid}").exists(), 300, "the study's controller to end")
    assert "hpc-train: study done: best trial 0" in (study / "controller.log").read_text()
    shown = report(laptop, "studies/one")
    assert "trials: 1 completed, 0 stopped, 0 failed, 0 running, 0 paused (1 of 1 started)" in shown.stdout, shown


def test_a_script_job_and_a_packed_sweep_run_in_the_clusters_copy(laptop):
    """A user's script runs in the cluster's copy of the project, with the arguments given on the laptop; a packed
    sweep's runs share one allocation there."""
    remote = laptop["remote"]
    done = hpc_train(
        laptop, "launcher=slurm", f"cluster={PROFILE}", "strategy=single", "resources.gpus_per_node=1",
        "launcher.wait=true", "hydra.run.dir=outputs/script", "cluster.sync=ssh", "--", "train.py", "--lr", "0.5",
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "by ssh)" in done.stdout  # the tar stream through ssh, not rsync
    ran = json.loads((remote / "ran.json").read_text())
    assert ran["cwd"] == str(remote) and ran["argv"] == ["--lr", "0.5"]
    packed = hpc_train(
        laptop, "-m", "launcher=slurm", f"cluster={PROFILE}", "strategy=single", "launcher.pack.gpus_per_node=2",
        "launcher.pack.allocations=1", "hydra.sweep.dir=multirun/packed", "script.argv=[flaky.py]",
        "+script.overrides.x=0,1,3",
    )  # fmt: skip
    assert packed.returncode == 0, packed.stdout + packed.stderr
    watched = report(laptop, "multirun/packed", "--watch", "--every", "2")
    assert watched.returncode == 0, watched.stdout + watched.stderr
    rows = json.loads(report(laptop, "multirun/packed", "--json", "--no-png").stdout)
    assert [row["status"] for row in rows] == ["COMPLETED"] * 3
    assert len({row["slurm_job_id"].split(":")[0] for row in rows}) == 1  # one allocation


PYTHON_API = """
import json, hpc_train
job = hpc_train.submit({overrides!r}, config_dir="conf", run_dir="outputs/api")
summary = job.wait(timeout=300)
print(json.dumps({{"id": job.job_id, "state": job.state(), "step": summary["global_step"],
                   "again": job.summary() == summary}}))
"""


def test_the_python_api_submits_and_waits_from_the_laptop(laptop):
    overrides = [*TINY, "launcher=slurm", f"cluster={PROFILE}", "strategy=single", "resources.gpus_per_node=1"]
    python = laptop["env"]["HPC_TRAIN_SSH_LAPTOP_PYTHON"]
    done = as_laptop([python, "-c", PYTHON_API.format(overrides=overrides)], cwd=laptop["project"], timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    said = json.loads(done.stdout.strip().splitlines()[-1])
    assert said["state"] == "COMPLETED" and said["step"] == 4 and said["again"] and said["id"].isdigit()


HELD = ["launcher=slurm", f"cluster={PROFILE}", "model=toy_mlp", "strategy=single", "+cluster.extra.hold=true"]
SLOW_SBATCH = '#!/bin/sh\nsleep 0.3\nexec /usr/bin/sbatch "$@"\n'  # the cluster side queues for ~10 s


def _closed_port() -> int:
    """A port nothing listens on: one the kernel hands out free, released (a fixed one could be the server's)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _cluster_commands_running() -> List[str]:
    """The laptop's commands on the cluster that have not ended: serve.py records each one's exit code in
    ~/.cache/hpc_train/commands/<id>.json there (a runner gone without one has ended too)."""
    running = []
    for path in (cluster_home() / ".cache" / "hpc_train" / "commands").glob("*.json"):
        try:
            record = json.loads(path.read_text())
        except (OSError, ValueError):  # being written
            running.append(path.name)
            continue
        if "code" not in record and Path(f"/proc/{record.get('runner', 0)}").exists():
            running.append(path.name)
    return running


def _held_sweep(laptop, name: str, sweep: str) -> subprocess.Popen:
    """30 held jobs of 30 time limits: 30 sbatch calls on the cluster, each 0.3 s slower than sbatch (its setup
    lines put a slow sbatch first on the PATH of the cluster side), so the interruption lands mid-queueing."""
    env = laptop["env"]
    shim = cluster_home() / "slow-sbatch"
    cluster_file(laptop, shim / "sbatch", SLOW_SBATCH, 0o755)
    times = ",".join(str(minutes) for minutes in range(1, 31))
    command = [
        env["HPC_TRAIN_SSH_LAPTOP_PYTHON"], "-m", "hpc_train.cli", "--config-dir", "conf", "-m", *HELD,
        f"job_name={name}", f"resources.time={times}", f"hydra.sweep.dir={sweep}",
        f"cluster.setup=['export PATH={shim}:$PATH']",
    ]  # fmt: skip
    return as_laptop_popen(command, cwd=laptop["project"])


def test_ctrl_c_on_the_laptop_while_the_cluster_queues_cancels_the_whole_sweep(laptop):
    user, name = laptop["env"]["HPC_TRAIN_SSH_CLUSTER_USER"], f"lap-{uuid.uuid4().hex[:6]}"
    proc = _held_sweep(laptop, name, "multirun/ctrl-c")
    try:
        wait_for(lambda: len(slurm_jobs_of(user, name)) >= 4 or proc.poll() is not None, 180, "4 jobs queued")
        os.killpg(proc.pid, signal.SIGINT)
        out, _ = proc.communicate(timeout=180)
        assert proc.returncode == 130, out
        assert re.search(r"interrupted while queueing the sweep: the \d+ jobs already queued were cancelled", out), out
        # Not one left queued: read once the cluster's command has ended, after which nothing more can be queued.
        wait_for(lambda: _cluster_commands_running() == [], 60, "the cluster's hpc-train command to end")
        assert slurm_jobs_of(user, name) == []
    finally:
        subprocess.run(["scancel", "-u", user, "-n", name], capture_output=True)


def test_a_connection_cut_mid_submission_leaves_the_sweep_whole_and_found(laptop):
    """The laptop's control master killed while the cluster queues: the laptop says so; the submission goes on
    there to the end (all 30 jobs, not some); the next command from the laptop reconnects and lists them."""
    user, name = laptop["env"]["HPC_TRAIN_SSH_CLUSTER_USER"], f"cut-{uuid.uuid4().hex[:6]}"
    proc = _held_sweep(laptop, name, "multirun/cut")
    try:
        wait_for(lambda: len(slurm_jobs_of(user, name)) >= 4 or proc.poll() is not None, 180, "4 jobs queued")
        laptop_user = laptop["env"]["HPC_TRAIN_SSH_LAPTOP_USER"]
        subprocess.run(["pkill", "-KILL", "-u", laptop_user, "-f", "ssh .*-M -N -f"], check=True)
        out, _ = proc.communicate(timeout=120)
        assert proc.returncode == 1 and "dropped while the cluster's hpc-train ran" in out, out
        wait_for(lambda: len(slurm_jobs_of(user, name)) == 30, 180, "all 30 jobs queued on the cluster")
        sweep = laptop["project"] / "multirun" / "cut"
        rows = json.loads(report(laptop, "multirun/cut", "--json", "--no-png").stdout)
        assert len(rows) == 30 and (sweep / "jobs.tsv").exists()
        assert sorted(row["slurm_job_id"] for row in rows) == sorted(slurm_jobs_of(user, name))
    finally:
        subprocess.run(["scancel", "-u", user, "-n", name], capture_output=True)


@pytest.mark.parametrize(
    "override, key, words, code",
    [  # ssh's failures are Unreachable (nothing is wrong with the config); the cluster's old version is a refusal
        ("cluster.login=ssh://hpccluster@localhost:PORT", "cluster.login", "host key of", EXIT_UNREACHABLE),
        ("cluster.login=ssh://nobody@127.0.0.1:PORT", "cluster.login", "refused the login", EXIT_UNREACHABLE),
        ("cluster.login=ssh://hpccluster@127.0.0.1:CLOSED", "cluster.login", "cannot be reached", EXIT_UNREACHABLE),
        ("cluster.remote_python=OLD", "cluster.remote_python", "hpc_train 0.0.1", EXIT_REFUSED),
    ],
    ids=["host key unknown", "authentication refused", "unreachable", "version mismatch"],
)
def test_each_connection_problem_is_one_clear_message_and_nothing_is_queued(laptop, override, key, words, code):
    override = override.replace("OLD", laptop["env"]["HPC_TRAIN_SSH_OLD_PYTHON"])
    override = override.replace("PORT", laptop["env"]["HPC_TRAIN_SSH_PORT"]).replace("CLOSED", str(_closed_port()))
    done = hpc_train(laptop, *TINY, "launcher=slurm", f"cluster={PROFILE}", "strategy=single", override, timeout=120)
    assert done.returncode == code, done.stdout + done.stderr
    message = [line for line in done.stderr.splitlines() if line.startswith("hpc-train:")]
    assert len(message) == 1 and f"`{key}`" in message[0] and words in message[0] and "Fix:" in message[0], done.stderr
    assert "Traceback" not in done.stderr


def test_a_path_only_the_laptop_has_is_refused_and_a_dry_run_needs_no_connection(laptop):
    data = laptop_dir("datasets")  # in the laptop's home (0700): the cluster's user cannot see it
    alias = laptop["env"]["HPC_TRAIN_SSH_ALIAS"]
    connect = [laptop["env"]["HPC_TRAIN_SSH_LAPTOP_PYTHON"], "-m", "hpc_train.connect", alias]
    assert as_laptop([*connect, "--close"]).returncode == 0
    assert as_laptop([*connect, "--check"]).returncode == 1
    dry = hpc_train(laptop, *TINY, "launcher=slurm", f"cluster={PROFILE}", "strategy=single", "dry_run=true")
    assert dry.returncode == 0 and "#SBATCH" in dry.stdout, dry.stdout + dry.stderr
    assert f"no connection to {alias} is open" in dry.stderr and "capacity check could not run" in dry.stderr
    opened = as_laptop(  # no terminal here: a site where the key suffices
        [*connect[:-1], "--config-dir", "conf", f"cluster={PROFILE}"], cwd=laptop["project"]
    )
    assert opened.returncode == 0 and "connected to" in opened.stdout, opened.stdout + opened.stderr
    assert as_laptop([*connect, "--check"]).returncode == 0
    dry = hpc_train(laptop, *TINY, "launcher=slurm", f"cluster={PROFILE}", "strategy=single", "dry_run=true")
    assert dry.returncode == 0 and "no connection" not in dry.stderr, dry.stderr
    assert "capacity check could not run" not in dry.stderr  # sinfo answered, over the connection
    done = hpc_train(
        laptop, "launcher=slurm", f"cluster={PROFILE}", "strategy=single", "--", "train.py", "--data", str(data),
    )  # fmt: skip
    assert done.returncode == 2 and "`script.argv`" in done.stderr and "a path of this machine" in done.stderr


def test_a_dry_run_from_the_laptop_prints_the_clusters_script_and_a_connect_hint_that_works_pasted(laptop):
    """The login set by an override (not by the profile): the dry run's hint, pasted, opens the connection; the
    script it prints is the cluster's (its Python, its copy of the run dir), never the laptop's, and without a
    connection it says which parts the cluster fills in."""
    env, project = laptop["env"], laptop["project"]
    laptop_python, alias = env["HPC_TRAIN_SSH_LAPTOP_PYTHON"], env["HPC_TRAIN_SSH_ALIAS"]
    assert as_laptop([laptop_python, "-m", "hpc_train.connect", alias, "--close"]).returncode == 0
    words = [
        *TINY, "launcher=slurm", "cluster=slurm", f"cluster.login={alias}",
        f"cluster.remote_python={env['HPC_TRAIN_SSH_CLUSTER_PYTHON']}", "cluster.cpus_per_gpu=1", "strategy=single",
        "dry_run=true", "hydra.run.dir=outputs/dry",
    ]  # fmt: skip
    dry = hpc_train(laptop, *words)
    assert dry.returncode == 0, dry.stdout + dry.stderr
    hint = re.search(r"; (hpc-train-connect .*) opens one\.", dry.stderr)
    assert hint, dry.stderr
    remote_dir = f"~/hpc-train/{project.name}/outputs/dry"
    assert f"--requests {remote_dir}/slurm" in dry.stdout and str(project) not in dry.stdout, dry.stdout
    assert laptop_python not in dry.stdout and f"fills in ~ (your home on {alias}" in dry.stdout, dry.stdout
    pasted = shlex.split(hint.group(1))  # the laptop's venv has no console scripts: its python -m, the same words
    opened = as_laptop([laptop_python, "-m", "hpc_train.connect", *pasted[1:]], cwd=project)
    assert opened.returncode == 0 and "connected to" in opened.stdout, hint.group(1) + opened.stdout + opened.stderr
    dry = hpc_train(laptop, *words)
    assert dry.returncode == 0 and "no connection" not in dry.stderr, dry.stdout + dry.stderr
    run_dir = f"{laptop['remote']}/outputs/dry"
    assert f"#SBATCH --output={run_dir}/slurm/%j_0_log.out" in dry.stdout, dry.stdout
    agent = next(line for line in dry.stdout.splitlines() if line.startswith("exec "))
    assert agent.startswith(f"exec {cluster_home()}/") and f"--requests {run_dir}/slurm" in agent, agent
    assert str(project) not in dry.stdout and laptop_python not in dry.stdout, dry.stdout
    assert "fills in" not in dry.stdout and f"the run dir {run_dir} there" in dry.stdout, dry.stdout


@pytest.mark.parametrize("how", ["rsync", "ssh"])
def test_a_full_disk_on_the_cluster_during_the_sync_is_one_message(laptop, how):
    """The project's copy lands on a 1 MB file system; the project holds 3 MB: one message, nothing queued."""
    user = laptop["env"]["HPC_TRAIN_SSH_CLUSTER_USER"]
    small = cluster_home() / f"small-{how}"
    small.mkdir(exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(small)], check=True)
    try:
        shutil.chown(small, user, user)
        blob = laptop["project"] / f"blob-{how}.bin"
        blob.write_bytes(os.urandom(3 * 2**20))
        shutil.chown(blob, laptop["env"]["HPC_TRAIN_SSH_LAPTOP_USER"])
        done = hpc_train(
            laptop, *TINY, "launcher=slurm", f"cluster={PROFILE}", "strategy=single", f"cluster.sync={how}",
            f"cluster.remote_dir={small}/proj", "job_name=full-disk",
        )  # fmt: skip
        blob.unlink()
        assert done.returncode == 2, done.stdout + done.stderr
        message = [line for line in done.stderr.splitlines() if line.startswith("hpc-train:")]
        assert len(message) == 1 and "`cluster.remote_dir`" in message[0] and "disk is full" in message[0], message
        assert "Traceback" not in done.stderr and slurm_jobs_of(user, "full-disk") == []
    finally:
        subprocess.run(["umount", "-l", str(small)], check=False)


def test_a_run_dir_a_live_job_holds_is_refused_from_the_laptop_too(laptop):
    """The cluster's claim on the run dir: a second submission into it, from the laptop, is refused by the cluster
    side and said on the laptop in one message, exit code 2."""
    user = laptop["env"]["HPC_TRAIN_SSH_CLUSTER_USER"]
    held = [*TINY, "launcher=slurm", f"cluster={PROFILE}", "strategy=single", "+cluster.extra.hold=true"]
    try:
        first = hpc_train(laptop, *held, "job_name=claimed", "hydra.run.dir=outputs/claimed")
        assert first.returncode == 0, first.stdout + first.stderr
        again = hpc_train(laptop, *held, "job_name=claimed", "hydra.run.dir=outputs/claimed")
        assert again.returncode == 2, again.stdout + again.stderr
        job_id = slurm_jobs_of(user, "claimed")[0]
        assert job_id in again.stdout + again.stderr and len(slurm_jobs_of(user, "claimed")) == 1
    finally:
        subprocess.run(["scancel", "-u", user, "-n", "claimed"], capture_output=True)


def test_a_sweep_into_a_sweep_dir_whose_jobs_are_queued_is_refused_from_the_laptop_too(laptop):
    """The cluster side checks the sweep dir (the laptop has no Slurm to ask): a second sweep into it while the first's
    jobs are queued is refused there, before anything is queued, and said on the laptop in one message, exit code 2."""
    user = laptop["env"]["HPC_TRAIN_SSH_CLUSTER_USER"]
    held = [*TINY, "launcher=slurm", f"cluster={PROFILE}", "strategy=single", "+cluster.extra.hold=true"]
    held += ["job_name=taken", "hydra.sweep.dir=outputs/taken"]
    try:
        first = hpc_train(laptop, "-m", *held, "seed=1,2")
        assert first.returncode == 0, first.stdout + first.stderr
        jobs = slurm_jobs_of(user, "taken")
        again = hpc_train(laptop, "-m", *held, "seed=3,4")
        out = again.stdout + again.stderr
        assert again.returncode == 2 and "Traceback" not in out, out
        assert "invalid configuration for `hydra.sweep.dir`" in out and "live job(s) of another sweep" in out, out
        assert f"scancel {jobs[0].split('_')[0]}" in out and slurm_jobs_of(user, "taken") == jobs
    finally:
        subprocess.run(["scancel", "-u", user, "-n", "taken"], capture_output=True)


def test_a_job_that_will_not_fit_is_refused_by_the_clusters_memory_check_and_said_on_the_laptop(laptop):
    """The memory check runs where the job is planned: the cluster's login side, with its Python (torch there). A
    model whose floor alone (3.2 GB of parameters, gradients and AdamW state) exceeds a declared 2 GB GPU is refused
    there, said on the laptop in one message, exit code 2, and nothing is queued."""
    user = laptop["env"]["HPC_TRAIN_SSH_CLUSTER_USER"]
    big = [*TINY, "model.hidden=65536", "data.image_size=32", "strategy=single", "cluster.gpu_memory_gb=2"]
    refused = hpc_train(laptop, *big, "launcher=slurm", f"cluster={PROFILE}", "job_name=toobig")
    out = refused.stdout + refused.stderr
    assert refused.returncode == 2 and "Traceback" not in out, out
    assert "the job will not fit in one GPU's memory" in out and "needs at least" in out, out
    assert slurm_jobs_of(user, "toobig") == []
