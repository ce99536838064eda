"""Checkpoints written in the background (trainer.async_checkpoint, on by default), for each strategy that writes them.

What must hold: a run whose saves are written in the background ends with the same weights as the same run saving
synchronously (bit-identical: staging copies the state exactly); a kill -9 while a save is being written in the
background, training going on meanwhile, leaves the previous checkpoint the resume target, and the rerun removes the
torn write and ends equal to the uninterrupted run. The write is slowed by the fault hook HPC_TRAIN_SLOW_CHECKPOINT
(it pauses half-way, in the background thread). Here: HSDP and the pipelining engine; single and ddp are covered the
same way by tests/e2e/test_checkpoint.py, fsdp by tests/e2e/test_fsdp.py (whose references save in the loop), a full
disk by tests/e2e/test_fsdp.py, a stop signal by tests/e2e/test_stop_during_checkpoint.py.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import List

import pytest
import torch

from tests.support.cli import (
    TINY,
    assert_ok,
    checkpoint_steps,
    kill_group,
    read_summary,
    run_cli,
    start_background,
    wait_for,
)

# Ranks forked warm (tests/support/warm_ranks.py) for the synchronous and the resumed runs; the run killed mid-write
# starts fresh ones (start_background), in the process group the kill reaches.
pytestmark = pytest.mark.usefixtures("warm_ranks")

# 512 samples / batch 64 = 8 steps per epoch, 2 epochs; checkpoints every 3 steps.
ARGS = [*TINY, "trainer.epochs=2", "trainer.checkpoint_every=3", "trainer.keep_checkpoints=3"]
STRATEGIES = {  # single and ddp: tests/e2e/test_checkpoint.py; fsdp: tests/e2e/test_fsdp.py (the same test)
    "hsdp": ["strategy=fsdp", "resources.gpus_per_node=4", "strategy.replicate=2"],
    "pipelining": ["strategy=pipeline", "strategy.engine=pipelining", "resources.gpus_per_node=2", "strategy.chunks=2"],
}
SLOW_WRITE_S = 2  # each background write pauses this long half-way,
STEP_SLEEP_S = 0.8  # and the first attempt's steps are slowed: 3 steps between saves outlast a write


def weights(run_dir: Path) -> dict:
    """Every final weights file of a run (the pipelining engine writes one per stage), by file and tensor name."""
    files = sorted(run_dir.glob("model*.pt"))
    assert files, f"no final weights in {run_dir}"
    return {(f.name, k): v for f in files for k, v in torch.load(f, weights_only=True).items()}


def temporaries(run_dir: Path) -> List[str]:
    folder = run_dir / "checkpoints"
    return sorted(p.name for p in folder.iterdir() if p.name.startswith(".")) if folder.is_dir() else []


def checkpoint_rows(run_dir: Path) -> List[dict]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [row for row in rows if row["kind"] == "checkpoint"]


@pytest.mark.parametrize("name", sorted(STRATEGIES))
def test_background_saves_end_equal_and_a_kill9_mid_write_resumes_from_the_previous_one(name, tmp_path):
    args = [*ARGS, *STRATEGIES[name]]
    synchronous = tmp_path / "synchronous"
    assert_ok(run_cli([*args, "trainer.async_checkpoint=false"], synchronous))
    assert {row["async"] for row in checkpoint_rows(synchronous)} == {False}

    run_dir = tmp_path / "run"
    proc = start_background(
        args, run_dir, {"HPC_TRAIN_SLOW_CHECKPOINT": str(SLOW_WRITE_S), "HPC_TRAIN_STEP_SLEEP": str(STEP_SLEEP_S)}
    )
    try:  # step 3's save completed in the background while training went on; step 6's is half-written
        wait_for(
            lambda: (
                checkpoint_steps(run_dir) == [3] and any(t.startswith(".step_000000006") for t in temporaries(run_dir))
            ),
            180,
            "the second background write",
        )
    finally:
        kill_group(proc)
    assert checkpoint_steps(run_dir) == [3], "a torn background write never appears under a checkpoint name"
    first = checkpoint_rows(run_dir)[0]
    assert first["step"] == 3 and first["async"] is True
    assert first["blocked_s"] < first["total_s"] - SLOW_WRITE_S / 2, first  # the loop did not wait for the write

    proc = run_cli(args, run_dir)  # the same command resumes
    assert_ok(proc)
    assert temporaries(run_dir) == [], "the killed write's leftovers are removed"
    summary = read_summary(run_dir)
    assert summary["resumed_from_step"] == 3 and summary["global_step"] == 16
    assert summary["checkpoint_blocked_s"] == pytest.approx(
        sum(r["blocked_s"] for r in checkpoint_rows(run_dir) if r["step"] > 3), abs=1e-5
    )
    ours, reference = weights(run_dir), weights(synchronous)
    assert ours.keys() == reference.keys()
    for key in reference:
        assert torch.equal(ours[key], reference[key]), f"{key} differs from the run that saved synchronously"
