"""Hydra habits on the real Slurm test cluster: a user's own cluster profile, an Optuna study of real jobs."""

from __future__ import annotations

import json
import re
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Dict, Tuple

import pytest
import yaml

from hpc_train.conf import CONFIG_DIR
from tests.support.cli import TINY, assert_ok, run_cli
from tests.support.slurm import scontrol_job, wait_for_job_end

pytestmark = pytest.mark.slurm

TRAIN = [*TINY, "trainer.max_steps=6", "trainer.epochs=null", "trainer.batch_size=32"]


def test_readme_walk_own_cluster_profile_to_a_submitted_job(slurm_cluster, tmp_path):
    """README, "Cluster profiles": copy the generic profile into my_conf/cluster/, edit it, submit."""
    conf = tmp_path / "my_conf" / "cluster"
    conf.mkdir(parents=True)
    printed = run_cli(["--cfg", "job", "-p", "cluster", "launcher=slurm"])  # the README's copy command
    assert_ok(printed)
    assert yaml.safe_load(printed.stdout) == yaml.safe_load((Path(CONFIG_DIR) / "cluster" / "slurm.yaml").read_text())
    profile = yaml.safe_load(printed.stdout)  # the user's edit
    profile.update(
        name="mysite",
        partition="gpu_p2",
        gpus_per_node=2,
        cpus_per_gpu=1,
        time="00:05:00",
        setup=["echo my-site-setup-ran"],
    )
    (conf / "mysite.yaml").write_text(yaml.safe_dump(profile))
    run_dir = tmp_path / "run"
    proc = run_cli(
        [
            "--config-dir",
            str(tmp_path / "my_conf"),
            *TRAIN,
            "launcher=slurm",
            "cluster=mysite",
            "strategy=ddp",
            "launcher.wait=true",
        ],
        run_dir,
    )
    assert_ok(proc)
    job_id = re.search(r"submitted Slurm job (\d+)", proc.stdout).group(1)
    fields = wait_for_job_end(job_id)
    assert fields["JobState"] == "COMPLETED"
    assert fields["Partition"] == "gpu_p2" and fields["NumTasks"] == "2" and fields["TimeLimit"] == "00:05:00"
    assert json.loads((run_dir / "summary.json").read_text())["world_size"] == 2
    assert "my-site-setup-ran" in "".join(p.read_text() for p in (run_dir / "slurm").glob("*_log.out"))


# Two Optuna studies of real Slurm jobs, followed to their ends: the first in two batches of 2 jobs; the second's
# grid over a batch that does not split over 2 DDP ranks (31) and one that does (32).
TWO_BATCHES = [
    "-m",
    "hydra/sweeper=optuna",
    "hydra.sweeper.sampler.seed=0",
    "hydra.sweeper.n_trials=4",
    "hydra.sweeper.n_jobs=2",
    "trainer.lr=interval(0.01,0.3)",
    *TRAIN,
    "launcher=slurm",
    "cluster.cpus_per_gpu=1",
    "cluster.time=5",
    "strategy=single",
]
ONE_REFUSED = [
    "-m",
    "hydra/sweeper=optuna",
    "hydra.sweeper.sampler.seed=1",
    "hydra.sweeper.n_trials=3",
    "hydra.sweeper.n_jobs=1",
    "hydra.sweeper.max_failure_rate=1.0",
    "trainer.batch_size=choice(31,32)",
    *[o for o in TRAIN if not o.startswith("trainer.batch_size=")],
    "launcher=slurm",
    "cluster.cpus_per_gpu=1",
    "cluster.time=5",
    "strategy=ddp",
    "resources.gpus_per_node=2",
]


@pytest.fixture(scope="module")
def studies(slurm_cluster, tmp_path_factory) -> Dict[str, Tuple[Path, subprocess.CompletedProcess]]:
    """Both studies side by side (each waits on its own jobs between its batches); (sweep dir, the command) by name."""
    folder = tmp_path_factory.mktemp("studies")
    with ThreadPoolExecutor(2) as pool:
        runs = {
            name: pool.submit(run_cli, [*args, f"hydra.sweep.dir={folder / name}"], timeout=600)
            for name, args in (("two-batches", TWO_BATCHES), ("one-refused", ONE_REFUSED))
        }
    return {name: (folder / name, run.result()) for name, run in runs.items()}


def test_optuna_study_of_real_slurm_jobs_in_two_batches(studies):
    sweep, proc = studies["two-batches"]
    assert_ok(proc)
    rows = [line.split("\t") for line in (sweep / "jobs.tsv").read_text().splitlines()]
    assert rows[0][0] == "job_id" and len(rows) == 5, rows  # one header, then both batches appended
    arrays = {row[0].split("_")[0] for row in rows[1:]}
    assert len(arrays) == 2, f"two batches, one job array each: {rows}"
    for row in rows[1:]:
        assert scontrol_job(row[0])["JobState"] == "COMPLETED"
    losses = [json.loads((sweep / row[1] / "summary.json").read_text())["eval_loss"] for row in rows[1:]]
    results = yaml.safe_load((sweep / "optimization_results.yaml").read_text())
    assert results["best_value"] == pytest.approx(min(losses), rel=1e-9)
    assert proc.stdout.count("waiting for this batch of 2 job(s)") == 2


def test_optuna_trial_that_fails_validation_is_not_submitted_and_not_fatal(studies):
    """Grid over a batch that does not split over 2 DDP ranks (31) and one that does (32): one job queued.

    The seeded sampler draws both values in 3 trials. (Optuna 2.10's grid sampler raises when its
    last point fails, so it is not used here.)
    """
    sweep, proc = studies["one-refused"]
    assert_ok(proc)
    assert "not submitted" in proc.stderr and "`trainer.batch_size`" in proc.stderr
    rows = [line.split("\t") for line in (sweep / "jobs.tsv").read_text().splitlines()[1:]]
    assert 1 <= len(rows) < 3 and all("trainer.batch_size=32" in row[2] for row in rows), rows
    assert yaml.safe_load((sweep / "optimization_results.yaml").read_text())["best_params"] == {
        "trainer.batch_size": 32
    }
