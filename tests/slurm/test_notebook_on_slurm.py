"""notebooks/demo_model_parallelism.ipynb against the Slurm test cluster: it submits when Slurm answers, and lowers
cpus_per_gpu to what the test cluster's nodes hold."""

from __future__ import annotations

import os
import re
import subprocess
from typing import List

import pytest

from tests.e2e.test_notebook import SMALL, run_notebook, slurm_cells
from tests.support.slurm import scontrol_job
from tests.support.slurm_cluster import SUITE_NODES


def node_cpus() -> int:
    """The fewest CPUs of a node of the test cluster's default partition."""
    out = subprocess.run(
        ["sinfo", "-h", "-N", "-p", "debug", "-o", "%c"], capture_output=True, text=True, check=True
    ).stdout
    return min(int(c.rstrip("+")) for c in out.split())


def check_fits(job_ids: List[str], cpus_per_task: int) -> None:
    """`scontrol show job`: each job asks for cpus_per_task CPUs (at most a node's), and none pends for a partition
    limit."""
    most = node_cpus()
    for job_id in job_ids:
        fields = scontrol_job(job_id)
        assert int(fields["NumTasks"] if "NumTasks" in fields else 1) == 1, fields
        assert int(fields["CPUs/Task"]) == cpus_per_task <= most, fields
        assert fields.get("Reason") != "PartitionConfig" and "Partition" not in fields.get("Reason", ""), fields


@pytest.mark.slurm
def test_notebook_submits_to_slurm_when_it_answers(slurm_cluster, tmp_path):
    overrides = [
        "cluster.cpus_per_gpu=1",
        "cluster.time=5",
        "resources.gpus_per_node=2",
        "trainer.max_steps=3",
        "trainer.epochs=null",
        "trainer.eval=false",
        "trainer.progress=false",
        "data.num_samples=64",
    ]
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
    # CPU_SCALE_DOWN = False: the timing as on a GPU node (small sizes given), no budget.
    params = {**SMALL, "CPU_SCALE_DOWN": "False", "SUBMIT": "True", "WAIT": "True", "SLURM_OVERRIDES": repr(overrides)}
    nb, text, images, elapsed = run_notebook(tmp_path, params, env, timeout=400)
    assert "Scaled down" not in text and "CPU budget" not in text
    assert (
        "model resnet18, batch 16 x 3 x 32 x 32, 2 stages, micro-batches [1, 2, 4], 1 warm-up + 2 timed passes per "
        "point" in text
    )
    assert f"partition debug (the default): {SUITE_NODES} node(s) with 16 CPUs and 4 GPUs each (sinfo)." in text
    assert "The request: 1 node(s) x 2 GPUs, 1 x 2 = 2 CPUs per task: fits." in text
    sweep_dirs = list((tmp_path / "out" / "slurm_sweep").iterdir())
    assert len(sweep_dirs) == 1
    sweep = sweep_dirs[0]
    assert (sweep / "jobs.tsv").exists()
    for job in ("0", "1", "2"):
        assert (sweep / job / "summary.json").exists(), job
    rows = [line for line in text.splitlines() if re.match(r"^[012] +[\d_]+ +strategy\.chunks=[124] +pipeline ", line)]
    assert len(rows) == 3 and all("COMPLETED" in row for row in rows), text
    assert len(images) == 2  # the timing plot and the sweep report
    job_ids = [line.split("\t")[0] for line in (sweep / "jobs.tsv").read_text().splitlines()[1:]]
    out = subprocess.run(
        ["sacct", "-n", "-X", "-P", "-o", "State", "-j", ",".join(job_ids)], capture_output=True, text=True
    )
    assert out.stdout.split() == ["COMPLETED"] * 3
    check_fits(job_ids, cpus_per_task=2)


@pytest.mark.slurm
def test_notebook_lowers_cpus_per_gpu_to_the_test_cluster_nodes(slurm_cluster, tmp_path):
    # Asked for 16 CPUs per GPU x 2 GPUs = 32 CPUs on 16-CPU nodes: the notebook lowers it to 8
    # (16 CPUs / 2 GPUs), the jobs are queued, and Slurm can run them (read back, then cancelled).
    overrides = [
        "cluster.cpus_per_gpu=16",
        "cluster.time=5",
        "resources.gpus_per_node=2",
        "trainer.max_steps=3",
        "trainer.epochs=null",
        "trainer.eval=false",
        "trainer.progress=false",
        "data.num_samples=64",
    ]
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
    _, text, _, _ = run_notebook(
        tmp_path,
        {**SMALL, "SUBMIT": "True", "WAIT": "False", "SLURM_OVERRIDES": repr(overrides)},
        env,
        cells=slurm_cells,
    )
    job_ids = re.findall(r"^Slurm job (\d+(?:_\d+)?) \(strategy\.chunks=", text, flags=re.M)
    try:
        assert (
            "cluster.cpus_per_gpu=16 would ask for 32 CPUs per task, but the nodes of partition debug (the default) "
            "have 16: lowered to 8 (16 CPUs / 2 GPUs)." in text
        )
        assert "The request: 1 node(s) x 2 GPUs, 8 x 2 = 16 CPUs per task: fits." in text
        assert len(job_ids) == 3, text
        check_fits(job_ids, cpus_per_task=16)
    finally:
        if job_ids:
            subprocess.run(["scancel", *job_ids], capture_output=True)
