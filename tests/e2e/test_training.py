"""Real multi-process training on CPU with gloo: DDP is exact, and the main job learns digits."""

import json
import re

import pytest

from tests.support.cli import TINY, assert_ok, read_summary, run_cli

STEPS = 20
BATCH = 32


def _digests(run_dir, world):
    found = []
    for rank in range(world):
        text = (run_dir / "logs" / f"rank{rank}.log").read_text()
        found.append(re.findall(r"final parameter digest ([0-9a-f]{64})", text)[-1])
    return found


@pytest.fixture(scope="module")
def single_and_ddp(tmp_path_factory):
    base = tmp_path_factory.mktemp("equiv")
    common = [*TINY, f"trainer.batch_size={BATCH}", f"trainer.max_steps={STEPS}", "trainer.epochs=null", "trainer.eval=false", "seed=7"]
    runs = {}
    for name, extra in (("single", ["strategy=single"]), ("ddp", ["strategy=ddp", "resources.gpus_per_node=2"])):
        proc = run_cli([*common, *extra], base / name)
        assert_ok(proc)
        runs[name] = base / name
    return runs


def test_ddp_matches_single_process_loss(single_and_ddp):
    single, ddp = (read_summary(single_and_ddp[k]) for k in ("single", "ddp"))
    assert single["world_size"] == 1 and ddp["world_size"] == 2
    assert single["global_step"] == ddp["global_step"] == STEPS
    # Same seed, same global batch, same samples per step: the losses agree to rounding error.
    assert ddp["train_loss"] == pytest.approx(single["train_loss"], rel=1e-4)
    # And training did something: the loss moved from its start.
    assert single["train_loss"] > 0


def test_ddp_ranks_end_with_identical_parameters(single_and_ddp):
    rank0, rank1 = _digests(single_and_ddp["ddp"], 2)
    assert rank0 == rank1


def test_only_rank_zero_writes_outputs(single_and_ddp):
    run_dir = single_and_ddp["ddp"]
    assert (run_dir / "summary.json").exists() and (run_dir / "model.pt").exists()
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    for kind in ("train", "checkpoint"):
        steps = [int(re.search(r'"step": (\d+)', line).group(1)) for line in lines if f'"kind": "{kind}"' in line]
        assert steps == sorted(set(steps)), f"one {kind} line per step: a second writer would duplicate them"
    assert any('"kind": "checkpoint"' in line for line in lines)  # the end of training's checkpoint, by rank 0
    assert (run_dir / "logs" / "rank0.log").exists() and (run_dir / "logs" / "rank1.log").exists()


def test_summary_fields(single_and_ddp):
    summary = read_summary(single_and_ddp["ddp"])
    for key in ("strategy", "world_size", "global_step", "train_loss", "eval_accuracy", "samples_per_sec", "images_per_sec", "resumed_from_step"):
        assert key in summary
    assert summary["strategy"] == "ddp"
    assert summary["eval_accuracy"] is None  # eval was off
    assert summary["resumed_from_step"] is None
    assert summary["samples_per_sec"] > 0 and summary["images_per_sec"] == summary["samples_per_sec"]  # the old name, kept


def test_main_job_learns_digits(tmp_path):
    """`hpc-train` with no arguments: DDP over 2 CPU processes, ResNet-18 on digits, >= 0.90 accuracy."""
    proc = run_cli([], tmp_path / "main", env=None)
    assert_ok(proc)
    summary = read_summary(tmp_path / "main")
    assert summary["strategy"] == "ddp" and summary["model"] == "resnet18" and summary["data"] == "digits"
    assert summary["world_size"] == 2
    assert summary["eval_accuracy"] >= 0.90
    assert str(tmp_path / "main" / "summary.json") in proc.stdout


@pytest.mark.parametrize("background", [False, True])
def test_each_checkpoint_logs_what_it_cost_and_the_summary_totals_the_time_training_waited(tmp_path, background):
    run_dir = tmp_path / "run"
    args = [*TINY, "strategy=single", "trainer.max_steps=6", "trainer.checkpoint_every=3", "trainer.eval=false"]
    proc = run_cli([*args, f"trainer.async_checkpoint={str(background).lower()}"], run_dir)
    assert_ok(proc)
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    saves = [row for row in rows if row["kind"] == "checkpoint"]
    assert [row["step"] for row in saves] == [3, 6]
    for row in saves:
        assert row["async"] is background and 0 < row["blocked_s"] <= row["total_s"]
        if not background:  # a save written in the loop blocks it for all its duration
            assert row["blocked_s"] == row["total_s"]
        assert row["bytes"] == (run_dir / "checkpoints" / f"step_{row['step']:09d}.ckpt").stat().st_size
    blocked = read_summary(run_dir)["checkpoint_blocked_s"]
    assert blocked == pytest.approx(sum(r["blocked_s"] for r in saves), abs=1e-5)
    assert f", checkpoints blocked training {blocked:.1f} s" in proc.stdout  # the run's closing line says it too
