"""Training recipes: optimizer, parameter groups, schedule, clipping, accumulation, eval cadence, EMA.

Real runs of the CLI (gloo on CPU for the multi-rank ones); every number is checked against a
closed form or a plain-PyTorch reference computed here.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Dict, List

import pytest
import torch
import torch.nn.functional as F

from hpc_train.compute.checkpointing.files import read_checkpoint
from hpc_train.compute.datasets import synthetic
from hpc_train.compute.models import toy_mlp
from hpc_train.compute.training.reproducible import seed_everything
from tests.support.cli import (
    TINY,
    assert_bit_identical,
    assert_ok,
    final_weights,
    kill9_after_checkpoints,
    read_summary,
    run_cli,
)
from tests.support.paths import REPO

pytestmark = pytest.mark.usefixtures("warm_ranks")  # ranks forked warm (tests/support/warm_ranks.py)

STEPS = ["trainer.epochs=null", "trainer.eval=false"]
DDP2 = ["strategy=ddp", "resources.gpus_per_node=2"]
FSDP2 = ["strategy=fsdp", "resources.gpus_per_node=2"]
PIPELINING2 = ["strategy=pipeline", "strategy.engine=pipelining", "resources.gpus_per_node=2", "strategy.chunks=4"]
ADAMW_BETAS = "trainer.optimizer={_target_:torch.optim.AdamW,_partial_:true,betas:[0.9,0.99]}"


def rows(run_dir: Path, kind: str = "train") -> List[Dict]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["kind"] == kind]


def newest_checkpoint(run_dir: Path) -> Dict:
    return read_checkpoint(sorted((run_dir / "checkpoints").glob("step_*.ckpt"))[-1])


# -- optimizer, parameter groups, schedule ------------------------------------------------------
def warmup_cosine(step: int, lr: float, min_lr: float, warmup: int, total: int) -> float:
    """The LR after `step` scheduler steps: linear warm-up, then cosine from lr down to min_lr (nanoGPT's shape)."""
    if step < warmup:
        return lr * (step + 1) / warmup
    progress = min(1.0, (step - warmup) / (total - warmup))
    return min_lr + (lr - min_lr) * 0.5 * (1 + math.cos(math.pi * progress))


def test_lr_follows_warmup_then_cosine_to_min_lr_in_every_group(tmp_path):
    run = tmp_path / "run"
    assert_ok(
        run_cli(
            [
                *TINY,
                *STEPS,
                "strategy=single",
                "trainer.max_steps=12",
                "trainer.log_every=1",
                ADAMW_BETAS,
                "trainer.lr_schedule=cosine",
                "trainer.lr=0.1",
                "trainer.min_lr=0.01",
                "trainer.lr_warmup_steps=3",
                "trainer.param_groups=no_decay_1d",
                "trainer.weight_decay=0.1",
            ],
            run,
        )
    )
    logged = rows(run)
    assert [r["step"] for r in logged] == list(range(1, 13))
    for r in logged:
        expected = warmup_cosine(r["step"], 0.1, 0.01, 3, 12)
        assert r["lr"] == pytest.approx(expected, abs=1e-7) and r["lr_group1"] == pytest.approx(expected, abs=1e-7)
    assert logged[-1]["lr"] == pytest.approx(0.01, abs=1e-7)  # the floor, not 0
    groups = newest_checkpoint(run)["shards"]["model"]["optimizer"]["param_groups"]
    assert [tuple(g["betas"]) for g in groups] == [(0.9, 0.99)] * 2  # the user's betas, in every group
    assert [g["weight_decay"] for g in groups] == [0.1, 0.0]  # matrices decayed, 1-D parameters not


def test_a_torch_scheduler_and_the_users_own_groups(tmp_path):
    run = tmp_path / "run"
    assert_ok(
        run_cli(
            [
                *TINY,
                *STEPS,
                "strategy=single",
                "trainer.max_steps=7",
                "trainer.log_every=1",
                "trainer.lr_schedule={_target_:torch.optim.lr_scheduler.StepLR,_partial_:true,step_size:3,gamma:0.5}",
                "trainer.param_groups={_target_:tests.support.recipe_parts.halve_first_layer,_partial_:true}",
            ],
            run,
        )
    )
    for r in rows(run):
        assert r["lr"] == pytest.approx(0.1 * 0.5 ** (r["step"] // 3), abs=1e-9)
        assert r["lr_group1"] == pytest.approx(0.025 * 0.5 ** (r["step"] // 3), abs=1e-9)


def test_no_decay_1d_leaves_biases_alone(tmp_path):
    """A loss with zero gradient: only AdamW's decoupled weight decay moves parameters, by (1 - lr * wd) a step."""
    common = [
        *TINY,
        *STEPS,
        "strategy=single",
        "trainer.optimizer=adamw",
        "trainer.weight_decay=0.5",
        "trainer.loss._target_=tests.support.recipe_parts.zero_loss",
        "+trainer.loss._partial_=true",
    ]
    weights = {}
    for groups, steps in (("no_decay_1d", 1), ("no_decay_1d", 3), ("single", 3)):
        run = tmp_path / f"{groups}-{steps}"
        assert_ok(run_cli([*common, f"trainer.param_groups={groups}", f"trainer.max_steps={steps}"], run))
        weights[groups, steps] = final_weights(run)
    one, three, every = weights["no_decay_1d", 1], weights["no_decay_1d", 3], weights["single", 3]
    for name in one:
        if one[name].dim() < 2:
            assert three[name].equal(one[name]), f"{name} was decayed"
            assert not every[name].equal(one[name]), f"{name}: param_groups=single decays it (the contrast)"
        else:
            torch.testing.assert_close(three[name], one[name] * (1 - 0.1 * 0.5) ** 2, rtol=1e-6, atol=0)


def test_a_bad_optimizer_argument_is_refused_naming_the_key(tmp_path):
    proc = run_cli(
        [
            *TINY,
            *STEPS,
            "strategy=single",
            "trainer.max_steps=2",
            "trainer.optimizer={_target_:torch.optim.AdamW,_partial_:true,betaz:[0.9,0.99]}",
        ],
        tmp_path / "run",
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "`trainer.optimizer`" in proc.stdout + proc.stderr and "betaz" in proc.stdout + proc.stderr


# -- gradient norm and clipping ------------------------------------------------------------------
ONE_FULL_BATCH = [
    *TINY,
    *STEPS,
    "data.num_samples=64",
    "trainer.batch_size=64",
    "trainer.max_steps=1",
    "trainer.log_every=1",
    "trainer.momentum=0",
    "trainer.lr=1.0",
]


def reference_gradients():
    """Plain PyTorch: the toy MLP as every run initialises it (seed 0), its gradient over the whole training set."""
    seed_everything(0)
    model = toy_mlp(image_size=8, num_classes=10)
    images, labels = synthetic(64, image_size=8).tensors
    F.cross_entropy(model(images), labels).backward()
    initial = {name: p.detach().clone() for name, p in model.named_parameters()}
    norm = torch.nn.utils.get_total_norm([p.grad for p in model.parameters()])
    return initial, float(norm)


@pytest.mark.parametrize(
    "name, strategy",
    [("single", ["strategy=single"]), ("ddp-2", DDP2), ("fsdp-2", FSDP2), ("pipelining-2", PIPELINING2)],
)
def test_grad_norm_is_the_whole_models_and_clipping_bounds_it(name, strategy, tmp_path):
    initial, norm = reference_gradients()
    clip = 0.5
    assert norm > clip
    run = tmp_path / name
    assert_ok(run_cli([*ONE_FULL_BATCH, *strategy, f"trainer.grad_clip={clip}"], run))
    assert rows(run)[0]["grad_norm"] == pytest.approx(norm, abs=1e-5)  # the norm before clipping
    if name != "pipelining-2":  # (its weights are saved per stage)
        # SGD without momentum at lr 1: the update is minus the clipped gradient, whose norm is at most `clip`.
        final = final_weights(run)
        update = torch.linalg.vector_norm(
            torch.stack([torch.linalg.vector_norm(final[k] - initial[k]) for k in initial])
        )
        assert float(update) == pytest.approx(clip, rel=1e-5)


# -- gradient accumulation -----------------------------------------------------------------------
ACCUM = [*TINY, *STEPS, "trainer.batch_size=32", "trainer.max_steps=10", "trainer.log_every=5"]


@pytest.fixture(scope="module")
def accumulated(tmp_path_factory):
    base = tmp_path_factory.mktemp("accum")
    runs = {
        "single-1": ["strategy=single"],
        "single-4": ["strategy=single", "trainer.grad_accum_steps=4"],
        "ddp2-2": [*DDP2, "trainer.grad_accum_steps=2"],
        "fsdp2-2": [*FSDP2, "trainer.grad_accum_steps=2"],
    }
    for name, overrides in runs.items():
        assert_ok(run_cli([*ACCUM, *overrides], base / name))
    return base


@pytest.mark.parametrize("name, reference", [("single-4", "single-1"), ("ddp2-2", "single-4"), ("fsdp2-2", "single-4")])
def test_accumulation_trains_as_one_big_batch(accumulated, name, reference):
    got, want = read_summary(accumulated / name), read_summary(accumulated / reference)
    assert got["train_loss"] == pytest.approx(want["train_loss"], abs=1e-5)
    a, b = final_weights(accumulated / name), final_weights(accumulated / reference)
    for key in b:
        torch.testing.assert_close(a[key], b[key], rtol=0, atol=1e-5)
    assert got["global_step"] == 10 and got["samples_per_sec"] > 0 and got["images_per_sec"] == got["samples_per_sec"]


def test_a_whole_recipe_resumes_bit_identically_after_kill_9(tmp_path):
    """Accumulation, clipping, a user optimizer with groups, cosine to min_lr, eval cadence and EMA, on 2 ranks."""
    args = [
        *TINY,
        *DDP2,
        "trainer.epochs=null",
        "trainer.max_steps=24",
        "trainer.checkpoint_every=4",
        "trainer.batch_size=32",
        "trainer.grad_accum_steps=2",
        "trainer.ema_decay=0.9",
        "trainer.grad_clip=1.0",
        "trainer.eval_every=8",
        "trainer.eval_batches=1",
        ADAMW_BETAS,
        "trainer.param_groups=no_decay_1d",
        "trainer.weight_decay=0.1",
        "trainer.lr_schedule=cosine",
        "trainer.min_lr=0.01",
        "trainer.lr_warmup_steps=3",
    ]
    straight, interrupted = tmp_path / "straight", tmp_path / "interrupted"
    assert_ok(run_cli(args, straight))
    killed_at = kill9_after_checkpoints(args, interrupted)
    assert 0 < killed_at < 24
    assert_ok(run_cli(args, interrupted))
    assert read_summary(interrupted)["resumed_from_step"] is not None
    assert_bit_identical(straight, interrupted)
    ema_a = newest_checkpoint(straight)["shards"]["model"]["ema"]
    ema_b = newest_checkpoint(interrupted)["shards"]["model"]["ema"]
    assert ema_a.keys() == ema_b.keys() and all(ema_a[k].equal(ema_b[k]) for k in ema_a)
    assert [r["step"] for r in rows(straight, "eval")] == [r["step"] for r in rows(interrupted, "eval")] == [8, 16, 24]
    exported = tmp_path / "ema.pt"
    export = subprocess.run(
        [sys.executable, "-m", "hpc_train.compute.checkpointing.export", "--ema", str(interrupted), str(exported)],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    assert export.returncode == 0, export.stderr
    assert all(torch.load(exported, weights_only=True)[k].equal(ema_a[k]) for k in ema_a)


def test_fsdp_weight_average_survives_kill_9_and_exports(tmp_path):
    args = [
        *TINY,
        *FSDP2,
        "trainer.epochs=null",
        "trainer.max_steps=20",
        "trainer.checkpoint_every=4",
        "trainer.batch_size=32",
        "trainer.ema_decay=0.8",
        "trainer.eval_every=10",
        "trainer.eval_batches=1",
    ]
    straight, interrupted = tmp_path / "straight", tmp_path / "interrupted"
    assert_ok(run_cli(args, straight))
    assert 0 < kill9_after_checkpoints(args, interrupted) < 20
    assert_ok(run_cli(args, interrupted))
    exported = {}
    for run in (straight, interrupted):
        out = tmp_path / f"{run.name}-ema.pt"
        proc = subprocess.run(
            [sys.executable, "-m", "hpc_train.compute.checkpointing.export", "--ema", str(run), str(out)],
            capture_output=True,
            text=True,
            cwd=REPO,
        )
        assert proc.returncode == 0, proc.stderr
        exported[run.name] = torch.load(out, weights_only=True)
    a, b = exported["straight"], exported["interrupted"]
    weights = final_weights(straight)
    assert a.keys() == weights.keys()
    assert all(a[k].equal(b[k]) for k in a)
    assert any(not a[k].equal(weights[k]) for k in a)  # an average, not the final weights
    summary = read_summary(interrupted)
    assert summary["eval_loss_ema"] is not None and summary["eval_loss_ema"] != summary["eval_loss"]


# -- evaluation cadence ----------------------------------------------------------------------------
def test_eval_every_n_steps_on_the_first_n_batches(tmp_path):
    run = tmp_path / "run"
    assert_ok(
        run_cli(
            [
                *TINY,
                "trainer.epochs=null",
                "strategy=single",
                "trainer.max_steps=10",
                "trainer.batch_size=32",
                "data.val_samples=256",
                "trainer.eval_every=4",
                "trainer.eval_batches=2",
            ],
            run,
        )
    )
    evals = rows(run, "eval")
    assert [r["step"] for r in evals] == [4, 8, 10]
    assert all(r["samples"] == 2 * 32 for r in evals)
    assert read_summary(run)["eval_loss"] == evals[-1]["loss"]


def test_a_validation_stream_without_length_is_evaluated(tmp_path):
    run = tmp_path / "run"
    assert_ok(
        run_cli(
            [
                *TINY,
                *DDP2,
                "trainer.epochs=null",
                "trainer.max_steps=6",
                "trainer.batch_size=16",
                "trainer.eval_every=3",
                "trainer.eval_batches=3",
                "data.val={_target_:tests.support.recipe_parts.SyntheticStream,num_samples:1000,image_size:8}",
            ],
            run,
        )
    )
    evals = rows(run, "eval")
    assert [r["step"] for r in evals] == [3, 6]
    assert all(r["samples"] == 2 * 3 * 8 for r in evals)  # 2 ranks x 3 batches x 8 samples


# -- throughput -------------------------------------------------------------------------------------
def test_tokens_per_sec_counts_every_ranks_tokens(tmp_path):
    run = tmp_path / "run"
    assert_ok(
        run_cli(
            [
                *TINY,
                *DDP2,
                *STEPS,
                "trainer.max_steps=12",
                "trainer.batch_size=32",
                "objective=train_loss",
                "trainer.step={_target_:tests.support.recipe_parts.step_with_tokens,_partial_:true}",
            ],
            run,
        )
    )
    summary = read_summary(run)
    assert summary["tokens_per_sec"] == pytest.approx(3 * summary["samples_per_sec"], rel=1e-9)
    assert rows(run)[-1]["tokens_per_sec"] > 0
