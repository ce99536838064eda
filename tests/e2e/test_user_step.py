"""trainer.step: the user's own training step, batches of any structure, and the checks around them.

The step contract (hpc_train/compute/user/step.py): step(model, batch) returns a scalar loss or a mapping
with 'loss' and other scalar metrics. A user step doing what the built-in step does must give
bit-identical weights; its metrics are averaged over the global batch and reported beside the loss.
"""

from __future__ import annotations

import json

import pytest

from tests.support.cli import TINY, assert_bit_identical, assert_ok, read_summary, run_cli

pytestmark = pytest.mark.usefixtures("warm_ranks")  # ranks forked warm (tests/support/warm_ranks.py)

DDP = ["strategy=ddp", "resources.gpus_per_node=2", "trainer.epochs=1"]


def step_node(target: str) -> str:
    return f"trainer.step={{_target_:{target},_partial_:true}}"


# -- real runs --------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def builtin_ddp(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("builtin")
    assert_ok(run_cli([*TINY, *DDP], run_dir))
    return run_dir


def test_a_user_step_doing_the_built_in_computation_gives_bit_identical_weights(builtin_ddp, tmp_path):
    assert_ok(run_cli([*TINY, *DDP, step_node("tests.support.user_steps.cross_entropy")], tmp_path / "run"))
    assert_bit_identical(builtin_ddp, tmp_path / "run")
    ours, builtin = read_summary(tmp_path / "run"), read_summary(builtin_ddp)
    assert ours["eval_loss"] == pytest.approx(builtin["eval_loss"], abs=1e-6), "batch-size-weighted mean"
    assert ours["eval_accuracy"] is None, "accuracy comes from the built-in step only"


def test_a_user_steps_metrics_are_logged_and_can_be_the_objective(builtin_ddp, tmp_path):
    """mynet.steps.with_top1: top1 over the global batch equals the built-in step's accuracy (same weights)."""
    from tests.e2e.test_user_project import PROJECT

    run_dir = tmp_path / "run"
    args = [*TINY, *DDP, step_node("mynet.steps.with_top1"), "objective=eval_top1", "trainer.log_every=1"]
    assert_ok(run_cli(args, run_dir, cwd=PROJECT))
    assert_bit_identical(builtin_ddp, run_dir)
    summary, builtin = read_summary(run_dir), read_summary(builtin_ddp)
    assert summary["eval_top1"] == pytest.approx(builtin["eval_accuracy"], abs=1e-9)
    assert 0 <= summary["train_top1"] <= 1
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if r["kind"] == "train"]
    assert len(train) == 8 and all("top1" in r and "loss" in r for r in train)
    assert train[-1]["top1"] == pytest.approx(summary["train_top1"])
    assert [r["top1"] for r in records if r["kind"] == "eval"] == [pytest.approx(summary["eval_top1"])]


@pytest.mark.parametrize(
    "target, words",
    [
        ("tests.support.user_steps.raises", "raised TypeError"),
        ("tests.support.user_steps.per_sample_loss", "not one number"),
        ("tests.support.user_steps.no_loss_key", "without a 'loss' key"),
        ("tests.support.user_steps.nowhere", "cannot build"),
    ],
)
def test_a_broken_step_is_refused_at_the_start_of_the_job(target, words, tmp_path):
    proc = run_cli([*TINY, "strategy=single", step_node(target)], tmp_path / "run")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2, out
    assert "`trainer.step`" in out and words in out and "Fix:" in out, out
    assert "Traceback" not in out, out
    assert not (tmp_path / "run" / "checkpoints").exists(), "nothing may train"


def test_data_shard_outside_a_job_is_the_whole_stream():
    """A streamed dataset built in a notebook or a unit test reads everything; `import hpc_train` stays torch-free."""
    import hpc_train

    assert hpc_train.data_shard() == (0, 1)
    from tests.support.cli import run_python

    proc = run_python("import sys, hpc_train; print('torch' in sys.modules)")
    assert proc.stdout.strip() == "False", proc.stdout + proc.stderr
