"""Today's models train unmodified: a GPT in nanoGPT's shape, Hugging Face's GPT-2 and a timm ViT.

Each runs from its own user project (examples/nanogpt_project, examples/hf_project) or straight
from its library (timm) with hpc-train's CLI, as their users write them: the model computes its own
loss (a 3-line trainer.step, or hpc_train.steps.model_loss), batches are dicts, data may stream.
"Same loss" means equal within 1e-4 after 5 steps: no dropout and no batch norm in these models,
so every layout computes the single process's steps up to floating-point reduction order.
"""

from __future__ import annotations

import re

import pytest

from tests.support.cli import assert_bit_identical, assert_ok, kill9_after_checkpoints, read_summary, run_cli
from tests.support.paths import REPO

pytestmark = pytest.mark.usefixtures("warm_ranks")  # ranks forked warm (tests/support/warm_ranks.py)

NANOGPT = REPO / "examples" / "nanogpt_project"
HF = REPO / "examples" / "hf_project"
QUIET = ["trainer.progress=false", "trainer.eval=false"]
GPT = ["--config-dir", "conf", "model=gpt", "trainer=gpt", *QUIET, "trainer.max_steps=5"]
GPT2 = ["--config-dir", "conf", "model=gpt2", "data=text_blocks", "trainer=hf", *QUIET, "trainer.max_steps=5"]
VIT = [
    "model._target_=timm.create_model",
    "+model.model_name=vit_tiny_patch16_224",
    "+model.img_size=32",
    "+model.patch_size=4",
    "model.num_classes=10",
    "data=synthetic",
    "data.num_samples=64",
    "data.val_samples=16",
    "trainer.batch_size=8",
    "trainer.max_steps=5",
    "trainer.lr_schedule=constant",
    *QUIET,
]
DDP = ["strategy=ddp", "resources.gpus_per_node=2"]


def loss_of(args, run_dir, cwd=None, **kwargs) -> float:
    assert_ok(run_cli(args, run_dir, cwd=cwd, **kwargs))
    summary = read_summary(run_dir)
    assert summary["global_step"] == 5
    return summary["train_loss"]


@pytest.mark.parametrize(
    "name, args, cwd",
    [
        ("nanogpt", GPT + ["data=chars"], NANOGPT),
        ("nanogpt-stream", GPT + ["data=chars_stream"], NANOGPT),
        ("hf-gpt2", GPT2, HF),
    ],
)
def test_language_models_train_the_same_under_single_and_ddp(name, args, cwd, tmp_path):
    """The stream's two ranks each read their half of every global batch (hpc_train.data_shard). The GPT also
    trains sharded (fsdp: its blocks transformer.h.*, the tied embedding and output layer in the root unit)."""
    single = loss_of([*args, "strategy=single"], tmp_path / "single", cwd=cwd)
    ddp = loss_of([*args, *DDP], tmp_path / "ddp", cwd=cwd)
    assert ddp == pytest.approx(single, abs=1e-4)
    if name == "nanogpt":
        fsdp = loss_of([*args, "strategy=fsdp", "resources.gpus_per_node=2"], tmp_path / "fsdp", cwd=cwd)
        assert fsdp == pytest.approx(single, abs=1e-4)


@pytest.fixture(scope="module")
def vit_single(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("vit")
    return loss_of([*VIT, "strategy=single"], run_dir)


@pytest.mark.parametrize(
    "layout",
    [
        DDP,
        ["strategy=fsdp", "resources.gpus_per_node=2"],
        ["strategy=pipeline", "strategy.stages=2", "strategy.chunks=2"],
        ["strategy=pipeline", "strategy.split_points=[blocks.6]", "strategy.chunks=2"],
        [
            "strategy=pipeline",
            "strategy.engine=pipelining",
            "strategy.split_points=[blocks.6]",
            "resources.gpus_per_node=2",
            "strategy.chunks=2",
        ],
    ],
    ids=["ddp", "fsdp", "pipeline-auto-2-stages", "pipeline-split-at-blocks.6", "pipelining-engine"],
)
def test_a_timm_vit_trains_the_same_under_every_layout(layout, vit_single, tmp_path):
    proc = run_cli([*VIT, *layout], tmp_path / "run")
    assert_ok(proc)
    if "strategy.stages=2" in layout:
        assert re.search(r"block list 'blocks' \(12 x Block\) into 2 stages at blocks\.6", proc.stdout + proc.stderr)
    assert read_summary(tmp_path / "run")["train_loss"] == pytest.approx(vit_single, abs=1e-4)


def test_nanogpt_with_the_built_in_step_is_told_to_set_trainer_step(tmp_path):
    """The first failure a nanoGPT user meets, now with the way out in the message."""
    proc = run_cli([*GPT, "data=chars", "trainer.step=null", "strategy=single"], tmp_path / "run", cwd=NANOGPT)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2 and "`trainer.loss`" in out and "trainer.step" in out and "Traceback" not in out, out


def test_dict_items_with_the_built_in_step_are_told_to_use_model_loss(tmp_path):
    proc = run_cli([*GPT2, "trainer.step=null", "strategy=single"], tmp_path / "run", cwd=HF)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2 and "`data.train`" in out and "hpc_train.steps.model_loss" in out, out
    assert "item 0 is a dict with keys input_ids, labels" in out and "Traceback" not in out, out


def test_a_stream_without_a_length_needs_max_steps(tmp_path):
    proc = run_cli(
        [*GPT, "data=chars_stream", "trainer.max_steps=null", "strategy=single"], tmp_path / "run", cwd=NANOGPT
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2 and "`trainer.max_steps`" in out and "Fix:" in out and "Traceback" not in out, out


def test_nanogpt_trains_with_nanogpts_shakespeare_char_recipe(tmp_path):
    """trainer=shakespeare_char (the project's conf): AdamW (0.9, 0.99), decay on matrices only, warm-up then cosine
    to min_lr, clipping at 1.0, evaluation every eval_interval steps on eval_iters batches; shortened here."""
    import json
    import math

    from hpc_train.compute.checkpointing.files import read_checkpoint

    run = tmp_path / "run"
    short = [
        "trainer.max_steps=20",
        "trainer.lr_warmup_steps=4",
        "trainer.eval_every=10",
        "trainer.eval_batches=2",
        "trainer.batch_size=16",
        "trainer.log_every=5",
        "trainer.checkpoint_every=10",
        "trainer.progress=false",
    ]
    assert_ok(
        run_cli(
            ["--config-dir", "conf", "model=gpt", "data=chars", "trainer=shakespeare_char", *DDP, *short],
            run,
            cwd=NANOGPT,
        )
    )
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if r["kind"] == "train"]
    for r in train:  # lr 1e-3, warm-up 4 steps, cosine to 1e-4 over 20 steps
        step = r["step"]
        want = (
            1e-3 * (step + 1) / 4
            if step < 4
            else 1e-4 + 0.9e-3 * 0.5 * (1 + math.cos(math.pi * min(1, (step - 4) / 16)))
        )
        assert r["lr"] == pytest.approx(want, abs=1e-9) and r["lr_group1"] == r["lr"]
        assert r["grad_norm"] > 0
    assert [r["step"] for r in records if r["kind"] == "eval"] == [10, 20]
    assert all(r["samples"] == 2 * 16 for r in records if r["kind"] == "eval")  # 2 batches of 8 on each of 2 ranks
    checkpoint = read_checkpoint(sorted((run / "checkpoints").glob("step_*.ckpt"))[-1])
    groups = checkpoint["shards"]["model"]["optimizer"]["param_groups"]
    assert [(tuple(g["betas"]), g["weight_decay"]) for g in groups] == [((0.9, 0.99), 0.1), ((0.9, 0.99), 0.0)]
    assert read_summary(run)["train_loss"] < 3.3  # below ln(30) = 3.4, the loss of a uniform guess


# -- kill -9 and rerun --------------------------------------------------------------------------------
# 12 steps, a checkpoint every 3 (killed after the second), evaluation on: the resumed run must end
# with the uninterrupted run's weights, bit for bit. The stream's 2048 windows / 16 = 128 steps an
# epoch; with num_windows=96 an epoch is 6 steps, so the runs also cross epoch boundaries of the stream.
RESUME = [
    "trainer.max_steps=12",
    "trainer.checkpoint_every=3",
    "trainer.keep_checkpoints=5",
    "trainer.eval=true",
    "strategy=single",
]


@pytest.mark.parametrize(
    "name, args, cwd, says",
    [
        ("hf-dict-batches", [*GPT2, *RESUME], HF, None),
        (
            "stream-without-state",
            [*GPT, "data=chars_stream_nostate", "data.train.num_windows=96", *RESUME],
            NANOGPT,
            "skipping the",
        ),
        (
            "stream-with-state-2-ranks",
            [*GPT, "data=chars_stream", "data.train.num_windows=96", *RESUME, *DDP],
            NANOGPT,
            None,
        ),
    ],
)
def test_kill9_and_rerun_resumes_bit_identically(name, args, cwd, says, tmp_path):
    reference = tmp_path / "reference"
    assert_ok(run_cli(args, reference, cwd=cwd))
    run_dir = tmp_path / "run"
    killed_at = kill9_after_checkpoints(args, run_dir, count=2, cwd=cwd)
    assert 0 < killed_at < 12
    proc = run_cli(args, run_dir, cwd=cwd)
    assert_ok(proc)
    log = proc.stdout + proc.stderr
    assert read_summary(run_dir)["resumed_from_step"] == killed_at
    if says:
        assert says in log, log
    else:
        assert "skipping the" not in log, log
    assert_bit_identical(reference, run_dir)
    assert read_summary(run_dir)["eval_loss"] == read_summary(reference)["eval_loss"]
