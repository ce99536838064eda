"""strategy=mesh with real gloo ranks on the Llama-style example: tensor parallel, FSDP shards, data replicas and
pipeline stages composed on one DeviceMesh train to the same weights as one process, and a checkpoint written at
one set of dimensions resumes at another.

"The same" is within 1e-4 (weights and every logged loss) after a few AdamW steps with the gradients clipped (the
logged norm, taken before clipping, is above the limit on every step, so the clipping is active): sharding changes
only the order of floating-point sums. The Llama example's own tensor-parallel plan (its strategy option
``llama_tp``, extending the shipped ``mesh``) is the user's plan under test.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Dict, List

import pytest
import torch
import yaml

from tests.support.cli import assert_ok, final_weights, read_summary, run_cli
from tests.support.paths import REPO

pytestmark = pytest.mark.usefixtures("warm_ranks")  # ranks forked warm (tests/support/warm_ranks.py)

PROJECT = REPO / "examples" / "llama_project"
CLIP = 0.5
LLAMA = [
    "--config-dir",
    "conf",
    "model=llama_tiny",
    "data=herd_log",
    "trainer=llama",
    "trainer.progress=false",
    f"trainer.grad_clip={CLIP}",
]
STEPS = 4
TRAIN = [*LLAMA, f"trainer.max_steps={STEPS}", "trainer.eval=false"]
EVALUATED = [*LLAMA, f"trainer.max_steps={STEPS}", "trainer.eval=true"]  # data.val after the last step
TP = ["strategy=llama_tp"]  # the example's plan: tp=2 over attention and SwiGLU projections


def run(args: List[str], run_dir: Path) -> None:
    assert_ok(run_cli(args, run_dir, cwd=PROJECT))


def losses(run_dir: Path) -> List[float]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [row["loss"] for row in rows if row.get("kind") == "train"]


def grad_norms(run_dir: Path) -> List[float]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [row["grad_norm"] for row in rows if row.get("kind") == "train"]


def assert_same_weights(a: Dict[str, torch.Tensor], b: Dict[str, torch.Tensor], tol: float = 1e-4) -> None:
    assert a.keys() == b.keys()
    worst = max((a[k].float() - b[k].float()).abs().max().item() for k in a)
    assert worst <= tol, f"weights differ by {worst:.2e}"


@pytest.fixture(scope="module")
def single(tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("single")
    # The project's own step (trainer=llama_tokens): the same loss as trainer=llama's built-in step, plus tokens/s.
    own_step = [arg if arg != "trainer=llama" else "trainer=llama_tokens" for arg in EVALUATED]
    run([*own_step, "strategy=single", "trainer.log_every=1"], run_dir)
    assert min(grad_norms(run_dir)) > CLIP, "the clipping must be active for this comparison to mean anything"
    return run_dir


@pytest.mark.parametrize(
    "layout, ranks, described",
    [
        ([*TP], 4, "dp_shard 2 x tp 2"),
        ([*TP, "strategy.dp_replicate=2", "strategy.dp_shard=1"], 4, "dp_replicate 2 x tp 2"),
        (["strategy=mesh", "strategy.pp=2"], 4, "pp 2 x dp_shard 2"),
        ([*TP, "strategy.pp=2", "strategy.dp_shard=2"], 8, "pp 2 x dp_shard 2 x tp 2"),
    ],
    ids=["tp2-dp_shard2", "dp_replicate2-tp2", "pp2-dp_shard2", "tp2-pp2-dp_shard2"],
)
def test_composed_dimensions_train_to_the_same_weights_as_one_process(layout, ranks, described, single, tmp_path):
    run_dir = tmp_path / "run"
    run([*EVALUATED, *layout, f"resources.gpus_per_node={ranks}", "trainer.log_every=1"], run_dir)
    assert f"mesh: {described} (this rank at" in (run_dir / "logs" / "rank0.log").read_text()
    assert losses(run_dir) == pytest.approx(losses(single), abs=1e-4)
    # evaluation counts each sample once: not once per tp rank, and only where the last stage has the loss
    assert read_summary(run_dir)["eval_loss"] == pytest.approx(read_summary(single)["eval_loss"], abs=1e-4)
    assert grad_norms(run_dir) == pytest.approx(grad_norms(single), rel=1e-4)  # the one norm over every shard
    assert_same_weights(final_weights(run_dir), final_weights(single))
    # Each rank's FLOPs are counted on the shards it computes: summed over the ranks, one process's
    assert read_summary(run_dir)["flops_per_step"] == read_summary(single)["flops_per_step"]


@pytest.fixture(scope="module")
def tp_checkpoint(tmp_path_factory) -> Path:
    """A tp2 x dp_shard2 run stopped after step 2: its DCP checkpoint, copied by each test that resumes it."""
    run_dir = tmp_path_factory.mktemp("tp")
    run([*LLAMA, "trainer.max_steps=2", "trainer.eval=false", *TP, "resources.gpus_per_node=4"], run_dir)
    return run_dir


@pytest.mark.parametrize(
    "layout, ranks",
    [
        (["strategy=mesh"], 4),  # dp_shard 4
        (["strategy=mesh"], 1),  # one process
        (["strategy=mesh", "strategy.pp=2"], 2),  # tp 1, pp 2
    ],
    ids=["as-dp_shard4", "as-one-process", "as-pp2"],
)
def test_a_tp2_dp_shard2_checkpoint_resumes_at_other_dimensions_equal_to_the_uninterrupted_run(
    layout, ranks, tp_checkpoint, single, tmp_path
):
    """Parameters and AdamW's state reshard from tp x FSDP shards to other shards, pipeline stages or one process."""
    run_dir = tmp_path / "run"
    subprocess.run(["cp", "-r", str(tp_checkpoint), str(run_dir)], check=True)
    run([*TRAIN, *layout, f"resources.gpus_per_node={ranks}"], run_dir)
    summary = read_summary(run_dir)
    assert summary["resumed_from_step"] == 2 and summary["global_step"] == STEPS
    assert_same_weights(final_weights(run_dir), final_weights(single))


def test_a_mesh_checkpoint_exports_to_one_ordinary_state_dict(tp_checkpoint, tmp_path):
    out = tmp_path / "exported.pt"
    proc = subprocess.run(
        [sys.executable, "-m", "hpc_train.compute.checkpointing.export", str(tp_checkpoint), str(out)],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr
    exported, final = torch.load(out, weights_only=True), final_weights(tp_checkpoint)
    assert exported.keys() == final.keys() and all(torch.equal(exported[k], final[k]) for k in final)
    assert all(not hasattr(value, "device_mesh") for value in exported.values())  # plain tensors, whole


def test_a_plan_pattern_that_matches_no_module_is_refused_at_start_naming_it(tmp_path):
    run_dir = tmp_path / "run"
    proc = run_cli(
        [
            *TRAIN,
            *TP,
            "resources.gpus_per_node=2",
            "strategy.dp_shard=1",
            "strategy.tp_plan={output:colwise_gather,attn_out:rowwise}",
        ],
        run_dir,
        cwd=PROJECT,
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    output = proc.stdout + proc.stderr
    assert "`strategy.tp_plan`: the pattern 'attn_out' matches no module of Transformer" in output
    assert "Traceback" not in output and not (run_dir / "checkpoints").exists()


def test_more_pipeline_stages_than_blocks_are_refused_at_start_naming_strategy_pp(tmp_path):
    proc = run_cli(
        [*TRAIN, "strategy=mesh", "strategy.pp=4", "resources.gpus_per_node=4"], tmp_path / "run", cwd=PROJECT
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "`strategy.pp`: Transformer's block list 'layers' has 2 blocks to cut, fewer than 4 stages." in proc.stdout
    assert "Fix: use at most strategy.pp=2" in proc.stdout and "Traceback" not in proc.stdout + proc.stderr


def test_an_fsdp_checkpoint_resumes_under_tensor_parallel_equal_to_the_uninterrupted_run(single, tmp_path):
    """fsdp is a preset of the mesh engine: its DCP checkpoint (2 shards) continues as tp 2, AdamW state included."""
    run_dir = tmp_path / "run"
    run([*LLAMA, "trainer.max_steps=2", "trainer.eval=false", "strategy=fsdp", "resources.gpus_per_node=2"], run_dir)
    run([*TRAIN, *TP, "strategy.dp_shard=1", "resources.gpus_per_node=2"], run_dir)
    assert read_summary(run_dir)["resumed_from_step"] == 2
    assert_same_weights(final_weights(run_dir), final_weights(single))


def test_the_llama_examples_tokens_per_second_are_its_samples_per_second_times_the_sequence_length(single):
    """The example's step returns `tokens` (each window's seq_len targets): how a language model's speed is read."""
    summary = read_summary(single)
    seq_len = yaml.safe_load((single / "job_config.yaml").read_text())["data"]["seq_len"]
    assert summary["tokens_per_sec"] == pytest.approx(summary["samples_per_sec"] * seq_len, rel=1e-9)
    rows = [json.loads(line) for line in (single / "metrics.jsonl").read_text().splitlines()]
    timed = [row for row in rows if row["kind"] == "train" and row.get("samples_per_sec")]
    assert timed and all(row["tokens_per_sec"] == pytest.approx(row["samples_per_sec"] * seq_len) for row in timed)
    assert summary["flops_per_step"] > 0 and summary["mfu"] is None  # counted; a CPU has no peak
