"""The nanoGPT-shaped user project (examples/nanogpt_project) on the Slurm test cluster: a two-node ddp job and a
two-job sweep over the learning rate."""

from __future__ import annotations

import re

from tests.e2e.test_transformer_models_train_unmodified import GPT, NANOGPT
from tests.support.cli import assert_ok, read_summary, run_cli
from tests.support.slurm import wait_for_job_end


def test_nanogpt_project_as_a_two_node_slurm_ddp_job(slurm_cluster, tmp_path):
    run_dir = tmp_path / "run"
    args = [
        *GPT,
        "data=chars",
        "launcher=slurm",
        "strategy=ddp",
        "resources.nodes=2",
        "resources.gpus_per_node=1",
        "launcher.wait=true",
    ]
    proc = run_cli(args, run_dir, cwd=NANOGPT, timeout=300)
    assert_ok(proc)
    job_id = re.search(r"submitted Slurm job (\d+)", proc.stdout).group(1)
    fields = wait_for_job_end(job_id)
    assert fields["JobState"] == "COMPLETED" and fields["NumNodes"] == "2", fields
    summary = read_summary(run_dir)
    assert summary["world_size"] == 2 and summary["model"] == "gpt" and summary["global_step"] == 5


def test_nanogpt_project_as_a_two_job_slurm_sweep_over_the_learning_rate(slurm_cluster, tmp_path):
    sweep = tmp_path / "sweep"
    args = [
        "-m",
        *GPT,
        "data=chars",
        "launcher=slurm",
        "strategy=single",
        "trainer.lr=0.001,0.003",
        "launcher.wait=true",
        f"hydra.sweep.dir={sweep}",
    ]
    proc = run_cli(args, None, cwd=NANOGPT, timeout=600)
    assert_ok(proc)
    rows = [line.split("\t") for line in (sweep / "jobs.tsv").read_text().splitlines()[1:]]
    assert len(rows) == 2
    summaries = [read_summary(sweep / row[1]) for row in rows]
    assert all(s["global_step"] == 5 for s in summaries)
    assert summaries[0]["train_loss"] != summaries[1]["train_loss"], "two learning rates, two runs"
