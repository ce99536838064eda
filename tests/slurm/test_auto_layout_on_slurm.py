"""strategy=auto in hpc-train's Slurm sweep: each job's layout chosen before anything is queued (its candidates
composed with that job's own overrides), the job queued with the chosen layout, which its run dir's job spec, its
layout_choice.json and Slurm's record of it (scontrol) agree on, its memory checked against the declared GPU. The
jobs are held (queued, using no CPU) and cancelled at the end."""

from __future__ import annotations

import json
import uuid

import pytest
import yaml

from hpc_train.jobs import job_table
from hpc_train.records import rundir
from tests.slurm.test_sweep_dir_taken import cancel
from tests.support.cli import assert_ok, run_cli
from tests.support.paths import REPO
from tests.support.slurm import scontrol_job

pytestmark = pytest.mark.slurm

PROJECT = REPO / "examples" / "llama_project"
AUTO = [
    "--config-dir",
    "conf",
    "model=llama_tiny",
    "data=herd_log",
    "trainer=llama",
    "strategy=auto",
    "strategy.mesh=llama_tp",
    "strategy.search=[fsdp,tp]",
    "model.n_heads=2",  # tp 4 does not divide 2 heads: set aside
    "trainer.batch_size=16",
    "resources.gpus_per_node=4",
    "launcher=slurm",
    "cluster=slurm",
    "cluster.cpus_per_gpu=1",
    "cluster.gpu_memory_gb=80",
    "+cluster.extra.hold=true",
]


def test_a_slurm_sweep_queues_each_job_with_the_layout_strategy_auto_chose_for_it(tmp_path):
    name = f"auto-{uuid.uuid4().hex[:8]}"
    sweep_dir = tmp_path / "sweep"
    words = ["-m", *AUTO, "trainer.lr=0.1,0.2", f"job_name={name}", f"hydra.sweep.dir={sweep_dir}"]
    try:
        proc = run_cli(words, None, cwd=PROJECT, timeout=300)
        assert_ok(proc)
        rows = job_table.read(sweep_dir)
        assert sorted(row.job for row in rows) == ["0", "1"], proc.stdout
        for row in rows:
            run_dir = sweep_dir / row.job
            choice = json.loads((run_dir / rundir.LAYOUT_CHOICE).read_text())
            fitting = [layout for layout in choice["layouts"] if "refused" not in layout]
            assert {layout["layout"] for layout in fitting} == {"fsdp 4", "dp_shard 2 x tp 2"}
            assert choice["chosen"] == min(fitting, key=lambda layout: layout["step_s"])
            spec = yaml.safe_load((run_dir / rundir.JOB_CONFIG).read_text())
            chosen = dict(override.split("=", 1) for override in choice["chosen"]["overrides"])
            assert spec["job"]["choices"]["strategy"] == chosen["strategy"], spec["job"]["choices"]
            assert spec["trainer"]["lr"] == float(row.overrides.split("trainer.lr=")[1].split()[0])
            estimate = json.loads((run_dir / rundir.MEMORY_ESTIMATE).read_text())
            assert 0 < estimate["need_bytes"] < estimate["gpu_memory_bytes"]
            queued = scontrol_job(row.job_id)  # Slurm's record: the layout's 4 tasks on one node
            assert queued["NumNodes"] in ("1", "1-1") and queued["NumTasks"] == "4", queued
    finally:
        cancel(name)
