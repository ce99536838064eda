"""The main job learns digits (real multi-process training on CPU with gloo; DDP's exactness: test_strategies.py);
what checkpoints cost."""

import json

import pytest

from tests.support.cli import TINY, assert_ok, read_summary, run_cli


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
