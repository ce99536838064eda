"""logger=tensorboard: TensorBoard event files beside metrics.jsonl, and a clear refusal without tensorboard."""

from __future__ import annotations

import json
import os

import pytest

from tests.support.cli import TINY, assert_ok, read_summary, run_cli

TRAIN = [*TINY, "trainer.max_steps=12", "trainer.epochs=null", "trainer.batch_size=32", "trainer.log_every=4"]


def scalars(log_dir):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(log_dir))
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def test_tensorboard_events_match_metrics_jsonl(tmp_path):
    run_dir = tmp_path / "run"
    proc = run_cli([*TRAIN, "strategy=ddp", "resources.gpus_per_node=2", "logger=tensorboard"], run_dir)
    assert_ok(proc)
    events = list((run_dir / "tensorboard").glob("events.out.tfevents.*"))
    assert len(events) == 1  # rank 0 only
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if r["kind"] == "train"]
    evals = [r for r in records if r["kind"] == "eval"]
    assert [r["step"] for r in train] == [4, 8, 12] and len(evals) == 1
    found = scalars(run_dir / "tensorboard")
    assert set(found) == {
        "train/loss",
        "train/lr",
        "train/grad_norm",
        "train/samples_per_sec",
        # where the time and memory went (mfu is null on a CPU: no peak, no scalar)
        "train/step_time_s",
        "train/data_share",
        "train/forward_backward_share",
        "train/optimizer_share",
        "train/checkpoint_share",
        "train/other_share",
        "train/flops_per_step",
        "train/tflops_per_device",
        "train/peak_memory_bytes",
        "eval/accuracy",
        "eval/loss",
    }  # every number of a record ("samples", the evaluation's count, is not a scalar to plot)
    assert [v for _, v in found["train/grad_norm"]] == pytest.approx([r["grad_norm"] for r in train], rel=1e-6)
    assert [s for s, _ in found["train/loss"]] == [4, 8, 12]
    assert [v for _, v in found["train/loss"]] == pytest.approx(
        [r["loss"] for r in train], rel=1e-6
    )  # stored as float32
    assert [v for _, v in found["train/lr"]] == pytest.approx([r["lr"] for r in train], rel=1e-6)
    assert found["eval/accuracy"] == [(12, pytest.approx(evals[0]["accuracy"], rel=1e-6))]
    assert found["train/loss"][-1][1] == pytest.approx(read_summary(run_dir)["train_loss"], rel=1e-6)


def test_absolute_log_dir(tmp_path):
    proc = run_cli(
        [*TRAIN, "strategy=single", "logger=tensorboard", f"logger.log_dir={tmp_path / 'tb'}"], tmp_path / "run"
    )
    assert_ok(proc)
    assert [s for s, _ in scalars(tmp_path / "tb")["train/loss"]] == [4, 8, 12]
    assert not (tmp_path / "run" / "tensorboard").exists()


def test_default_logger_writes_no_tensorboard_files(tmp_path):
    proc = run_cli([*TRAIN, "strategy=single", "trainer.max_steps=4"], tmp_path / "run")
    assert_ok(proc)
    assert (tmp_path / "run" / "metrics.jsonl").exists() and not (tmp_path / "run" / "tensorboard").exists()


@pytest.mark.parametrize("launcher", [["launcher=local"], ["launcher=slurm", "resources.gpus_per_node=2"]])
def test_missing_tensorboard_is_refused_before_anything_runs(launcher, tmp_path):
    # A real interpreter on which tensorboard cannot be found, as in an environment without it.
    shim = tmp_path / "shim"
    shim.mkdir()
    (shim / "sitecustomize.py").write_text("import sys\nsys.modules['tensorboard'] = None\n")
    env = dict(os.environ, PYTHONPATH=str(shim))
    run_dir = tmp_path / "run"
    proc = run_cli([*TRAIN, *launcher, "logger=tensorboard"], run_dir, env=env)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "invalid configuration for `logger`" in proc.stderr
    assert "pip install 'hpc-train[tensorboard]'" in proc.stderr and "logger=jsonl" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert (
        not (run_dir / "job_config.yaml").exists()
        and not (run_dir / "slurm").exists()
        and not (run_dir / "logs").exists()
    )
