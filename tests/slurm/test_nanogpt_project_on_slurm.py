"""The nanoGPT-shaped user project (examples/nanogpt_project) on the Slurm test cluster: a sweep of a one-node and a
two-node ddp job, run side by side."""

from __future__ import annotations

from tests.e2e.test_transformer_models_train_unmodified import GPT, NANOGPT
from tests.support.cli import assert_ok, read_summary, run_cli
from tests.support.slurm import wait_for_job_end


def test_nanogpt_project_as_a_slurm_sweep_of_a_one_and_a_two_node_ddp_job(slurm_cluster, tmp_path):
    """The project's own config dir and code in every job of a Slurm sweep, each job its own layout: each job's
    summary shows the world size its override asked for (the sweep's overrides reach each job)."""
    sweep = tmp_path / "sweep"
    args = [
        "-m",
        *GPT,
        "data=chars",
        "launcher=slurm",
        "strategy=ddp",
        "resources.nodes=1,2",
        "resources.gpus_per_node=1",
        "launcher.wait=true",
        f"hydra.sweep.dir={sweep}",
    ]
    proc = run_cli(args, None, cwd=NANOGPT, timeout=600)
    assert_ok(proc)
    rows = [line.split("\t") for line in (sweep / "jobs.tsv").read_text().splitlines()[1:]]
    assert len(rows) == 2
    for job_id, subdir, overrides, _layout in rows:
        nodes = 2 if "resources.nodes=2" in overrides else 1
        fields = wait_for_job_end(job_id)
        assert fields["JobState"] == "COMPLETED" and fields["NumNodes"] == str(nodes), fields
        summary = read_summary(sweep / subdir)
        assert summary["world_size"] == nodes and summary["model"] == "gpt" and summary["global_step"] == 5
