"""Ranks in an image on the real Slurm cluster: Slurm 22.05's OCI support (``srun --container``, oci.conf and crun set
up by scripts/slurm_test_cluster.sh) with a bundle built by scripts/container_test_image.sh, whose root file system
has its own Python (Debian's) and no trace of the launching virtual environment; its torch is the same build as
outside (bind-mounted read-only), so a job in the image equals the same job outside bit for bit.

Outside the image, on the batch host: the signal, the requeue, the hang's node exclusion (hpc_train.batchhost). The
image's runs under launcher=local (crun, no Slurm) are in tests/e2e/test_containers.py.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, Tuple

import pytest

from hpc_train.pack import records, status
from hpc_train.records import rundir
from tests.e2e.test_checkpoint import RESUME
from tests.e2e.test_containers import IMAGE_PYTHON, assert_ran_in_the_image, build_image, in_image
from tests.slurm.test_hang_slurm import HANG_S
from tests.slurm.test_hang_slurm import JOB as HANGING_JOB
from tests.support.cli import TINY, assert_bit_identical, assert_ok, checkpoint_steps, read_summary, run_cli, wait_for
from tests.support.paths import REPO, SCRIPTS
from tests.support.slurm import scontrol_job, squeue_ids, wait_for_job_end

pytestmark = pytest.mark.slurm

SLURM = ["launcher=slurm", "cluster.cpus_per_gpu=1", "cluster.time=5", "launcher.signal_delay_s=30"]
DDP = ["strategy=ddp", "resources.nodes=2", "resources.gpus_per_node=1"]  # OCI: one task per node


@pytest.fixture(scope="module")
def image(slurm_cluster, tmp_path_factory) -> Path:
    return build_image(tmp_path_factory.mktemp("image") / "bundle")


def submit(args, run_dir: Path, **env: str) -> str:
    proc = run_cli([*SLURM, *args], run_dir, env=dict(os.environ, **env))
    assert_ok(proc)
    return re.search(r"submitted Slurm job (\d+)", proc.stdout).group(1)


def finished(job: str, run_dir: Path, timeout: float = 180) -> Dict[str, str]:
    """The job's final state, once COMPLETED with a summary (a requeued job passes through PENDING again)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        fields = scontrol_job(job)
        if fields.get("JobState") == "COMPLETED" and (run_dir / rundir.SUMMARY).exists():
            return fields
        assert fields.get("JobState") not in ("FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL"), (job, fields)
        time.sleep(1)
    raise AssertionError(f"job {job} did not finish in {timeout} s: {scontrol_job(job).get('JobState')}")


@pytest.fixture(scope="module")
def pair(image, tmp_path_factory):
    """The same 2-rank ddp job in the image and outside it, run side by side (2 nodes each)."""
    folder = tmp_path_factory.mktemp("pair")
    inside, outside = folder / "inside", folder / "outside"
    jobs = submit([*RESUME, *DDP, *in_image(image)], inside), submit([*RESUME, *DDP], outside)
    finished(jobs[0], inside)
    finished(jobs[1], outside)
    return inside, outside


def test_ddp_in_the_image_equals_the_same_job_outside_it(pair, image):
    inside, outside = pair
    assert_bit_identical(outside, inside)
    assert_ran_in_the_image(inside, image)
    assert read_summary(outside)["python"]["executable"] != IMAGE_PYTHON
    report = subprocess.run(
        [sys.executable, "-m", "hpc_train.report.command", str(inside), "--no-png"], capture_output=True, text=True
    )
    assert f"image: {image} (sha256:" in report.stdout, report.stdout + report.stderr


# The two ways a job in the image is stopped for a requeue: the time limit's signal, and `scontrol requeue`
INTERRUPTIONS = {
    "signal": lambda job: ["scancel", "--batch", "--signal=USR2", job],  # as Slurm sends it before the limit
    "scontrol": lambda job: ["scontrol", "requeue", job],
}


@pytest.fixture(scope="module")
def requeued(image, pair, tmp_path_factory) -> Dict[str, Tuple[str, Path, Dict[str, str]]]:
    """The same job in the image twice, side by side (one requeue's time, not two): each interrupted as
    INTERRUPTIONS says once it wrote its first checkpoint; (Slurm id, run dir, final scontrol fields) by name."""
    folder = tmp_path_factory.mktemp("requeued")
    jobs = {
        name: submit([*RESUME, *DDP, *in_image(image)], folder / name, HPC_TRAIN_STEP_SLEEP="0.4")
        for name in INTERRUPTIONS
    }
    waiting = dict(jobs)

    def interrupt_the_checkpointed() -> bool:
        for name, job in list(waiting.items()):
            if checkpoint_steps(folder / name) != []:
                subprocess.run(INTERRUPTIONS[name](job), check=True)
                del waiting[name]
        return not waiting

    wait_for(interrupt_the_checkpointed, 120, "the first checkpoint of each job")
    return {name: (job, folder / name, finished(job, folder / name, timeout=240)) for name, job in jobs.items()}


def test_requeue_in_the_image_is_done_outside_it_and_resumes_exactly(image, pair, requeued):
    """The time limit's signal goes to the batch host (B:), which passes it on; rank 0 asks for the requeue and the
    batch host runs scontrol requeue, though the image has no Slurm commands."""
    job, run_dir, fields = requeued["signal"]
    assert fields["Restarts"] == "1"
    assert read_summary(run_dir)["attempts"] == 2
    assert f"hpc-train: requeued job {job}" in (run_dir / rundir.SLURM_LOGS / f"{job}_0_log.err").read_text()
    assert_bit_identical(pair[1], run_dir)
    assert_ran_in_the_image(run_dir, image)


def test_a_job_in_the_image_requeued_from_outside_resumes_exactly(image, pair, requeued):
    """`scontrol requeue` while it runs, as a preemption does: Slurm's SIGTERM reaches the ranks in the image, they
    checkpoint and stop, Slurm requeues the job, and it resumes from that checkpoint."""
    _, run_dir, fields = requeued["scontrol"]
    assert fields["Restarts"] == "1"
    assert read_summary(run_dir)["attempts"] == 2
    assert_bit_identical(pair[1], run_dir)
    assert_ran_in_the_image(run_dir, image)


def test_a_script_job_runs_in_the_image_with_the_jobs_variables(image, tmp_path):
    run_dir = tmp_path / "run"
    job = submit([*TINY, "strategy=dp", *in_image(image), "script.argv=[tests/support/scripts/show_env.py]"], run_dir)
    finished(job, run_dir)
    [env] = [json.loads(p.read_text()) for p in (run_dir / "env").glob("*.json")]
    assert env["PATH"].startswith("/opt/image-python/bin:"), env["PATH"]
    assert "VIRTUAL_ENV" not in env and not env.get("PYTHONPATH", "").startswith(str(REPO / ".venv"))
    assert env["SLURM_JOB_ID"] == job and env["SLURM_PROCID"] == "0"
    assert json.loads(env["HPC_TRAIN_CONTAINER_SEEN"])["executable"] == IMAGE_PYTHON


def test_a_packed_sweep_runs_each_job_step_in_the_image(image, tmp_path):
    sweep_dir = tmp_path / "sweep"
    args = [*TINY, "strategy=single", "trainer.max_steps=2", "trainer.eval=false", "seed=1,2,3,4"]
    pack = ["launcher.pack.allocations=1", "launcher.pack.gpus_per_node=2"]
    assert_ok(run_cli(["-m", *SLURM, *args, *pack, *in_image(image), f"hydra.sweep.dir={sweep_dir}"], None))
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        states = status.packed_states(sweep_dir)
        if len(states) == 4 and all(s.state in records.ENDED_STATES for s in states.values()):
            break
        time.sleep(1)
    assert {run: s.state for run, s in states.items()} == {str(n): "COMPLETED" for n in range(4)}
    for run in range(4):
        assert_ran_in_the_image(sweep_dir / str(run), image, ranks=1)


def test_a_hang_in_the_image_is_named_and_its_node_excluded_from_outside(image, tmp_path):
    run_dir = tmp_path / "run"
    job = submit([*HANGING_JOB, *in_image(image), "trainer.requeue_on_hang=true"], run_dir)
    try:
        wait_for(lambda: scontrol_job(job).get("Restarts") == "1", HANG_S + 120, "the job requeued")
        wait_for(lambda: scontrol_job(job).get("ExcNodeList") == "hpcnode2", 30, "hpcnode2 excluded")
        verdict = rundir.read_json(rundir.hang_file(run_dir))
        assert "rank 1 (host hpcnode2" in verdict["message"] and "in sleeps_forever" in verdict["message"]
        batch = (run_dir / rundir.SLURM_LOGS / f"{job}_0_log.err").read_text()
        assert f"hpc-train: requeued job {job} once, excluding node hpcnode2" in batch
    finally:  # the cluster left idle: the next tests expect their ranks on hpcnode1 and hpcnode2
        subprocess.run(["scancel", job], check=False)
        wait_for_job_end(job, timeout=120)
        wait_for(lambda: not squeue_ids(), 60, "the cluster idle")


def _variant(image: Path, folder: Path, change) -> Path:
    """A copy of the test image's bundle (its root file system shared) with config.json changed by `change`."""
    folder.mkdir()
    (folder / "rootfs").symlink_to((image / "rootfs").resolve())
    config = json.loads((image / "config.json").read_text())
    change(config)
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def _refused(run_dir: Path, job: str, bare: Path) -> str:
    """The refused job's last line (exit code 2, no training)."""
    fields = wait_for_job_end(job, timeout=120)
    assert fields["JobState"] == "FAILED" and fields["ExitCode"].startswith(f"{rundir.EXIT_REFUSED}:"), fields
    lines = (run_dir / rundir.SLURM_LOGS / f"{job}_0_log.err").read_text().strip().splitlines()
    assert lines[-1].startswith(f"hpc-train: the image {bare} cannot run hpc_train's ranks"), lines[-3:]
    assert not (run_dir / rundir.SUMMARY).exists()
    return lines[-1]


def test_an_image_without_torch_is_refused_at_the_first_rank(image, tmp_path):
    """One message naming the image and what it lacks, as the job's last line; no training."""

    def no_torch(config):
        config["mounts"] = [m for m in config["mounts"] if "/site-packages/" not in m["destination"]]

    bare = _variant(image, tmp_path / "bare", no_torch)
    run_dir = tmp_path / "run"
    assert "has no torch" in _refused(run_dir, submit([*TINY, *DDP, *in_image(bare)], run_dir), bare)


def test_an_image_without_python_is_refused_by_the_batch_host(image, tmp_path):
    def no_python(config):
        config["process"]["env"] = [e for e in config["process"]["env"] if not e.startswith("PATH=")]
        config["process"]["env"].append("PATH=/nowhere")

    bare = _variant(image, tmp_path / "bare", no_python)
    run_dir = tmp_path / "run"
    assert "no rank started its Python" in _refused(run_dir, submit([*TINY, *DDP, *in_image(bare)], run_dir), bare)


def test_a_hydra_app_on_hpc_train_slurm_runs_in_the_image(image, tmp_path):
    """Any Hydra app (the user's plain_app, no hpc_train in it): hydra.launcher.container.* runs its jobs in it."""
    sweep_dir = tmp_path / "sweep"
    app = [
        "hydra/launcher=hpc_train_slurm",
        "hydra.launcher.cpus_per_task=1",
        "hydra.launcher.timeout_min=5",
        "hydra.launcher.container.name=oci",
        f"hydra.launcher.container.image={image}",
    ]
    command = [sys.executable, "my_app.py", "-m", *app, "gpus=1", f"hydra.sweep.dir={sweep_dir}"]
    proc = subprocess.run(command, cwd=SCRIPTS / "plain_app", capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    seen = json.loads((sweep_dir / "0" / "seen.json").read_text())
    assert seen["python"] == IMAGE_PYTHON and seen["SLURM_JOB_ID"]
