"""logger=[wandb,mlflow] on the real Slurm test cluster: a 2-job sweep whose jobs run at the same time.

Each job writes its own MLflow store (sqlite:///<run dir>/mlflow.db: one writer per SQLite file,
whatever the file system) and its own W&B run, offline by default on Slurm, with the `wandb sync`
command in rank 0's log.
"""

from __future__ import annotations

import os

import pytest

from tests.e2e.test_trackers import history, metrics, mlflow_client, wandb_run
from tests.support.cli import TINY, assert_ok, run_cli
from tests.support.slurm import wait_for_job_end

pytestmark = pytest.mark.slurm

SLURM = ["launcher=slurm", "cluster.cpus_per_gpu=1", "cluster.time=5", "launcher.signal_delay_s=30"]
TRAIN = [
    *TINY,
    "strategy=single",
    "trainer.max_steps=12",
    "trainer.epochs=null",
    "trainer.batch_size=32",
    "trainer.log_every=4",
]


def test_a_sweep_of_two_concurrent_jobs_logs_each_to_its_own_mlflow_store_and_wandb_run(slurm_cluster, tmp_path):
    sweep_dir = tmp_path / "sweep"
    proc = run_cli(
        [
            "-m",
            *SLURM,
            *TRAIN,
            "seed=0,1",
            "logger=[wandb,mlflow]",
            "launcher.wait=true",
            f"hydra.sweep.dir={sweep_dir}",
        ],
        env=dict(os.environ, HPC_TRAIN_STEP_SLEEP="0.3"),  # long enough for the two jobs to overlap
    )
    assert_ok(proc)
    table = [line.split("\t") for line in (sweep_dir / "jobs.tsv").read_text().splitlines()[1:]]
    assert len(table) == 2
    spans, wandb_ids = [], set()
    for job_id, subdir, overrides, _layout in table:
        assert wait_for_job_end(job_id)["JobState"] == "COMPLETED"
        run_dir = sweep_dir / subdir
        train = metrics(run_dir, "train")
        assert [r["step"] for r in train] == [4, 8, 12]
        # MLflow: the job's own store in its run dir, read with MLflow's client
        client, run_id = mlflow_client(run_dir)
        assert client.tracking_uri == f"sqlite:///{run_dir}/mlflow.db"
        run = client.get_run(run_id)
        assert run.info.status == "FINISHED" and run.data.params["seed"] == overrides.split("seed=")[1].split()[0]
        assert history(client, run_id, "train_loss") == [(r["step"], r["loss"]) for r in train]
        spans.append((run.info.start_time, run.info.end_time))
        # W&B: offline by default on Slurm (no logger.mode given), the sync command in rank 0's log
        kept = (run_dir / "wandb_run.json").read_text()
        (folder,) = (run_dir / "wandb").glob("offline-run-*")
        logged = wandb_run(folder)
        assert logged["id"] in kept and logged["id"] not in wandb_ids
        wandb_ids.add(logged["id"])
        assert {s: row["train/loss"] for s, row in logged["rows"].items()} == {r["step"]: r["loss"] for r in train}
        sync = f"wandb sync {run_dir / 'wandb'}/offline-run-*-{logged['id']}"
        assert sync in (run_dir / "logs" / "rank0.log").read_text()
    # the two jobs ran at the same time: each MLflow run started before the other ended
    assert max(start for start, _ in spans) < min(end for _, end in spans), spans
