"""strategy=auto on CPU workers: every valid layout of the job's ranks estimated on fake tensors in one process, those
the estimate cannot run set aside with its reason, the others ranked by the modelled step time; the job runs the
first and keeps why (layout_choice.json). The model is the Llama-style example's, with its own tensor-parallel plan
(strategy.mesh=llama_tp: 4 heads, so tensor parallel over 8 ranks is set aside). A script job is refused: its script
lays out its own ranks."""

from __future__ import annotations

import json

import yaml

from hpc_train.records import rundir
from tests.support.cli import assert_ok, run_cli, run_cli_in_process
from tests.support.paths import REPO

PROJECT = REPO / "examples" / "llama_project"
LLAMA = ["--config-dir", "conf", "model=llama_tiny", "data=herd_log", "trainer=llama", "trainer.progress=false"]
AUTO = [*LLAMA, "strategy=auto", "strategy.mesh=llama_tp", "strategy.search=[fsdp,tp]", "trainer.batch_size=16"]


def test_on_8_cpu_ranks_the_job_runs_the_fastest_modelled_layout_of_those_that_fit_and_keeps_why(tmp_path):
    run_dir = tmp_path / "run"
    proc = run_cli([*AUTO, "resources.gpus_per_node=8", "trainer.max_steps=1"], run_dir, timeout=600, cwd=PROJECT)
    assert_ok(proc)
    choice = json.loads((run_dir / rundir.LAYOUT_CHOICE).read_text())
    layouts = {row["layout"]: row for row in choice["layouts"]}
    assert set(layouts) == {"fsdp 8", "dp_shard 4 x tp 2", "dp_shard 2 x tp 4", "tp 8"}
    assert "n_heads=4" in layouts["tp 8"]["refused"]  # the estimate's own words: tp=8 does not divide 4 heads
    fitting = [row for row in choice["layouts"] if "refused" not in row]
    assert choice["chosen"] == min(fitting, key=lambda row: row["step_s"])
    assert f"strategy=auto chose {choice['chosen']['layout']}" in proc.stdout
    ran = yaml.safe_load((run_dir / rundir.JOB_CONFIG).read_text())  # the chosen layout is the job's
    chosen = dict(override.split("=", 1) for override in choice["chosen"]["overrides"])
    assert ran["job"]["choices"]["strategy"] == chosen["strategy"] and ran["job"]["layout"]["world_size"] == 8
    assert ran["strategy"].get("tp", 1) == int(chosen.get("strategy.tp", ran["strategy"].get("tp", 1)))


def test_the_dry_run_prints_the_ranked_table_with_the_reason_each_layout_was_set_aside(tmp_path):
    proc = run_cli([*AUTO, "resources.gpus_per_node=4", "model.n_heads=2", "dry_run=true"], tmp_path, cwd=PROJECT)
    assert_ok(proc)
    table = proc.stdout[proc.stdout.index("strategy=auto: 3 layouts") :]
    ranked = [line.split(".", 1)[1].split("  ")[0].strip() for line in table.splitlines()[1:3]]
    assert sorted(ranked) == ["dp_shard 2 x tp 2", "fsdp 4"]
    assert "tp 4" in table and "set aside: `strategy.tp`" in table and "n_heads=2" in table
    assert f"chosen: {ranked[0]}" in table and not (tmp_path / rundir.LAYOUT_CHOICE).exists()


def test_a_script_job_is_refused_its_script_lays_out_its_own_ranks(tmp_path):
    proc = run_cli_in_process(
        ["strategy=auto", "resources.gpus_per_node=2", "dry_run=true", "--", "train.py"], tmp_path, refused=True
    )
    assert proc.returncode == rundir.EXIT_REFUSED
    assert "`strategy`" in proc.stderr and "script lays out its own ranks" in proc.stderr


def test_a_model_the_estimate_cannot_trace_is_refused_naming_its_module(tmp_path):
    gated = "model._target_=tests.unit.test_memory_estimate_refusals.Gated"  # a branch on a tensor's value
    job = ["model=toy_mlp", "data=synthetic", "data.image_size=8", gated, "strategy=auto", "strategy.search=[fsdp]"]
    proc = run_cli([*job, "resources.gpus_per_node=2", "dry_run=true"], tmp_path)
    assert proc.returncode == rundir.EXIT_REFUSED, proc.stdout + proc.stderr
    assert "found no layout it can run" in proc.stderr and "cannot trace module 'body.2'" in proc.stderr
