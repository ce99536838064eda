"""Ranks in an image under launcher=local: each rank its own bundle, run by the OCI runtime (crun, through the
wrapper scripts/container_test_image.sh writes), in the test image of scripts/container_test_image.sh, whose root
file system has its own Python (Debian's) and no trace of the launching virtual environment; its torch is the same
build as outside (bind-mounted read-only), so a run in the image equals the same run outside it bit for bit.

No Slurm: the same image's jobs on the Slurm test cluster are in tests/slurm/test_containers_on_slurm.py.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import List

import pytest

from hpc_train.records import rundir
from tests.e2e.test_checkpoint import RESUME, reference
from tests.support.cli import TINY, assert_bit_identical, assert_ok, read_summary, run_cli
from tests.support.paths import REPO

IMAGE_SCRIPT = REPO / "scripts" / "container_test_image.sh"
IMAGE_PYTHON = "/opt/image-python/bin/python3"
# What torchft imports beyond torch, bound into the image too (scripts/container_test_image.sh: HPC_TRAIN_IMAGE_EXTRA)
TORCHFT_PACKAGES = "torchft psutil opentelemetry opentelemetry_* google protobuf"


def build_image(bundle: Path, extra: str = "") -> Path:
    """The test image's bundle at `bundle` (well under a second: nothing is copied)."""
    env = dict(os.environ, HPC_TRAIN_IMAGE_EXTRA=extra)
    subprocess.run(["bash", str(IMAGE_SCRIPT), "build", str(bundle)], env=env, check=True)
    return bundle


def in_image(image: Path) -> List[str]:
    return ["container=oci", f"container.image={image}"]


def assert_ran_in_the_image(run_dir: Path, image: Path, ranks: int = 2) -> None:
    """The image's own Python ran every rank, in the image's root file system, and the summary says which image."""
    seen = read_summary(run_dir)["python"]
    assert seen["executable"] == IMAGE_PYTHON and seen["runtime"] == "oci", seen
    assert seen["image"] == str(image) and seen["root"] == str((image / "rootfs").resolve()), seen
    assert seen["digest"].startswith("sha256:"), seen  # the bundle's config.json, as the runtime took it
    for rank in range(ranks):
        log = rundir.rank_log(run_dir, rank).read_text()
        assert f"runs {IMAGE_PYTHON} (Python 3.11" in log and f"in the image {image} (oci; root" in log, log[:2000]


@pytest.fixture(scope="module")
def runtime(tmp_path_factory) -> str:
    """crun (or runc) as a site's wrapper gives it: by absolute path, with its own state folder."""
    if not (shutil.which("crun") or shutil.which("runc")):
        message = "neither crun nor runc is installed (scripts/slurm_test_cluster.sh install installs crun)"
        if os.environ.get("CI") == "true" or os.geteuid() == 0:
            pytest.fail(message)
        pytest.skip(message)
    folder = tmp_path_factory.mktemp("oci")
    subprocess.run(
        ["bash", str(IMAGE_SCRIPT), "runtime", str(folder / "oci-runtime"), str(folder / "state")], check=True
    )
    return str(folder / "oci-runtime")


@pytest.fixture(scope="module")
def image(tmp_path_factory) -> Path:
    return build_image(tmp_path_factory.mktemp("image") / "bundle")


def test_a_local_run_in_the_image_equals_the_same_run_outside_it(image, runtime, tmp_path_factory, tmp_path):
    """launcher=local with container=oci: each rank its own bundle, run by the OCI runtime given by absolute path."""
    local = [*RESUME, "strategy=ddp", "resources.gpus_per_node=2"]
    inside = tmp_path / "inside"
    assert_ok(run_cli([*local, *in_image(image), f"container.command={runtime}"], inside))
    assert_bit_identical(reference(tmp_path_factory, "ddp"), inside)  # the same 2 gloo ranks outside the image
    assert_ran_in_the_image(inside, image)


def test_replica_groups_train_in_the_image_and_a_dead_group_restarts_in_it(runtime, tmp_path):
    """launcher=local, 2 replica groups of one rank in an image with torchft: group 1's rank dies at step 6, its group
    starts again in a new container of the image and rejoins from group 0, and both end bit-identical. The lighthouse
    runs outside the image, beside the launcher. (An image without torchft is refused at the first rank:
    tests/unit/test_containers.py.)"""
    job = [*TINY, "trainer.epochs=null", "trainer.max_steps=30", "trainer.eval=false", "resources.gpus_per_node=2"]
    job += ["fault_tolerance.replica_groups=2", "fault_tolerance.timeout_s=5", f"container.command={runtime}"]
    with_torchft = build_image(tmp_path / "ft-image", extra=TORCHFT_PACKAGES)
    run_dir = tmp_path / "run"
    # Dead before step 7, and back after the heartbeat timeout (dropped first); from step 8 group 0 waits for it to ask
    # for its quorum before a step (HPC_TRAIN_HOLD_AT), so that it rejoins however long its restart takes
    failure = {"HPC_TRAIN_KILL_AT": "1:6", "HPC_TRAIN_RESTART_SLEEP": "6", "HPC_TRAIN_HOLD_AT": "8"}
    env = dict(os.environ, **failure, HPC_TRAIN_REPLICA_DIGESTS="1")
    proc = run_cli([*job, *in_image(with_torchft)], run_dir, env=env)
    assert_ok(proc)
    # The rank's death as the container runtime reports it (128 + SIGKILL), and group 1 alone restarted
    assert "replica group 1: rank 1 exited with code 137 (128 + 9" in proc.stderr, proc.stderr
    assert "restarting group 1 (1 of at most 3)" in proc.stderr and "restarting group 0" not in proc.stderr
    assert_ran_in_the_image(run_dir, with_torchft)
    second = rundir.rank_log(run_dir, 1).read_text().split("restarted, rejoining")[0].rsplit("INFO rank 0/1", 1)[1]
    assert f"in the image {with_torchft} (oci; root" in second  # the restarted group's start, in the image too
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    events = [(row["event"], row["group"]) for row in rows if row.get("kind") == "replica"]
    assert events == [("failed", 1), ("dropped", 1), ("restarted", 1), ("rejoined", 1)], events  # each on record
    finals = {re.findall(r"final parameter digest (\w+)", rundir.rank_log(run_dir, r).read_text())[-1] for r in (0, 1)}
    assert len(finals) == 1, finals


def test_an_adaptive_study_runs_every_rung_in_the_image_and_resumes_its_promoted_trial_there(image, runtime, tmp_path):
    """hydra/sweeper=adaptive with container=oci: the controller runs outside the image, every rung of every trial in
    it; the trial promoted to the full budget resumes its first rung's checkpoint in the image and ends equal to an
    uninterrupted run outside it. Two trials in two slots, rungs of 1 and 3 steps (eta 3)."""
    from hpc_train.jobs.study import trial_rows

    sweep_dir = tmp_path / "study"
    job = [*TINY, "trainer.batch_size=32", "trainer.checkpoint_every=0"]
    study = ["-m", *job, "hydra/sweeper=adaptive", "trainer.lr=interval(0.01,0.3)", "hydra.sweeper.sampler=random"]
    study += ["hydra.sweeper.seed=3", "hydra.sweeper.max_trials=2", "hydra.sweeper.max_concurrent=2"]
    study += ["hydra.sweeper.scheduler.max_resource=3", "hydra.sweeper.poll_s=0.3", f"hydra.sweep.dir={sweep_dir}"]
    assert_ok(run_cli([*study, *in_image(image), f"container.command={runtime}"]))
    rows = trial_rows(sweep_dir)
    assert sorted(row["status"] for row in rows) == ["completed", "stopped"], rows
    for row in rows:
        assert_ran_in_the_image(sweep_dir / str(row["number"]), image)
    promoted = next(row for row in rows if row["status"] == "completed")
    promoted_dir = sweep_dir / str(promoted["number"])
    assert "resumed from" in rundir.rank_log(promoted_dir, 0).read_text()  # its second rung went on from the first
    outside = tmp_path / "outside"
    assert_ok(run_cli([*job, f"trainer.lr={promoted['params']['trainer.lr']}", "trainer.max_steps=3"], outside))
    assert_bit_identical(outside, promoted_dir)
