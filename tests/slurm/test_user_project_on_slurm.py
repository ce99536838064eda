"""The user project (examples/user_project) on the Slurm test cluster: a job with its own cluster profile, and a
two-job sweep (one job of each strategy)."""

from __future__ import annotations

import json
import re

from tests.e2e.test_user_project import TRAIN, run_user
from tests.support.cli import assert_ok, read_summary
from tests.support.slurm import wait_for_job_end


def test_user_project_as_a_slurm_job_with_its_own_cluster_profile(slurm_cluster, tmp_path):
    run_dir = tmp_path / "run"
    proc = run_user(
        [
            *TRAIN,
            "launcher=slurm",
            "cluster=mysite",
            "strategy=pipeline",
            "strategy.split_points=[head]",
            "launcher.wait=true",
        ],
        run_dir,
        timeout=300,
    )
    assert_ok(proc)
    job_id = re.search(r"submitted Slurm job (\d+)", proc.stdout).group(1)
    fields = wait_for_job_end(job_id)
    assert fields["JobState"] == "COMPLETED" and fields["Partition"] == "gpu_p2"
    assert read_summary(run_dir)["model"] == "tinynet"


def test_user_project_as_a_two_job_slurm_sweep(slurm_cluster, tmp_path):
    sweep = tmp_path / "sweep"
    proc = run_user(
        [
            "-m",
            *TRAIN,
            "launcher=slurm",
            "cluster=mysite",
            "strategy=single,ddp",
            "launcher.wait=true",
            f"hydra.sweep.dir={sweep}",
        ],
        None,
        timeout=600,
    )
    assert_ok(proc)
    rows = [line.split("\t") for line in (sweep / "jobs.tsv").read_text().splitlines()[1:]]
    assert len(rows) == 2
    summaries = [json.loads((sweep / row[1] / "summary.json").read_text()) for row in rows]
    assert sorted(s["strategy"] for s in summaries) == ["ddp", "single"]
    assert all(s["model"] == "tinynet" for s in summaries)
