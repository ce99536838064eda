"""strategy=fsdp (FSDP2) and HSDP with real gloo ranks: the same training as one process, sharded
checkpoints that survive kill -9 and reshard to another number of ranks (4 to 2 and 2 to 4 with AdamW, a schedule
and clipping: test_elastic_resume.py), export (a full disk: test_disk_full.py).

"Same loss" is within 1e-4 after 5 steps: sharding changes only the order of floating-point
reductions. Models with batch norm (ResNet-18) normalise over each rank's share of the batch, so
they are compared with ddp at the same number of ranks, not with one process.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.support.cli import (
    TINY,
    assert_bit_identical,
    assert_ok,
    checkpoint_steps,
    final_weights,
    kill_group,
    read_summary,
    run_cli,
    start_background,
    wait_for,
)
from tests.support.reference_runs import reference_run

pytestmark = pytest.mark.usefixtures("warm_ranks")  # ranks forked warm (tests/support/warm_ranks.py)

FIVE = [*TINY, "trainer.max_steps=5", "trainer.eval=false"]
FSDP = ["strategy=fsdp"]


def ranks(n: int) -> list:
    return [f"resources.gpus_per_node={n}"]


def loss_after(args, run_dir: Path) -> float:
    proc = run_cli(args, run_dir)
    assert_ok(proc)
    return read_summary(run_dir)["train_loss"]


@pytest.fixture(scope="module")
def single_loss(tmp_path_factory):
    return loss_after([*FIVE, "strategy=single"], tmp_path_factory.mktemp("single"))


@pytest.mark.parametrize(
    "layout",
    [
        [*FSDP, *ranks(2)],
        [*FSDP, *ranks(4)],
        [*FSDP, *ranks(4), "strategy.replicate=2"],
        [*FSDP, *ranks(2), "strategy.reshard_after_forward=false"],
        [*FSDP, *ranks(2), "trainer.activation_checkpointing=blocks"],
        [*FSDP, *ranks(2), "trainer.compile=true"],
        [*FSDP, *ranks(2), "strategy.cpu_offload=true"],
    ],
    ids=[
        "fsdp-2",
        "fsdp-4",
        "hsdp-2x2",
        "no-reshard-after-forward",
        "activation-checkpointing",
        "compiled-blocks",
        "cpu-offload",
    ],
)
def test_fsdp_trains_like_one_process(layout, single_loss, tmp_path):
    kernels = tmp_path / "inductor"  # where torch's compiler writes the code it generates
    proc = run_cli([*FIVE, *layout], tmp_path / "run", env=dict(os.environ, TORCHINDUCTOR_CACHE_DIR=str(kernels)))
    assert_ok(proc)
    if "strategy.replicate=2" in layout:
        assert "HSDP: 2 replicas x 2 shards" in proc.stdout
    if "trainer.compile=true" in layout:  # the blocks were compiled: the rank says so, and kernels were generated
        assert "each unit's forward compiled" in (tmp_path / "run" / "logs" / "rank0.log").read_text()
        assert list(kernels.rglob("*.py")), "trainer.compile=true generated no code: the blocks ran uncompiled"
    assert read_summary(tmp_path / "run")["train_loss"] == pytest.approx(single_loss, abs=1e-4)


def test_activation_checkpointing_changes_no_loss(single_loss, tmp_path):
    loss = loss_after([*FIVE, "strategy=single", "trainer.activation_checkpointing=blocks"], tmp_path / "run")
    assert loss == pytest.approx(single_loss, abs=1e-5)


def test_a_resnet18_with_batch_norm_trains_like_ddp(tmp_path):
    resnet = [
        *TINY,
        "model=resnet18",
        "data.image_size=16",
        "trainer.batch_size=16",
        "trainer.max_steps=3",
        "trainer.eval=false",
    ]
    ddp = loss_after([*resnet, "strategy=ddp", *ranks(2)], tmp_path / "ddp")
    fsdp = loss_after([*resnet, *FSDP, *ranks(2)], tmp_path / "fsdp")
    assert fsdp == pytest.approx(ddp, abs=1e-4)


@pytest.mark.parametrize("precision", ["bf16", "16"])
def test_mixed_precision_trains(precision, single_loss, tmp_path):
    """bf16/fp16 parameters for compute, fp32 reductions (fp16 with torch's ShardedGradScaler)."""
    proc = run_cli([*FIVE, *FSDP, *ranks(2), f"trainer.precision={precision}"], tmp_path / "run")
    assert_ok(proc)
    assert f", {precision} parameters, fp32 reductions" in (tmp_path / "run" / "logs" / "rank0.log").read_text()
    loss = read_summary(tmp_path / "run")["train_loss"]
    # Computed in lower precision: not fp32's loss to rounding, yet close. Measured after these 5 steps: sharding in
    # fp32 moves the loss by 1.2e-7 (the reductions' order), fp16 by 7.7e-5, bf16 by 2.7e-4; 1e-5 lies between.
    assert abs(loss - single_loss) > 1e-5 and loss == pytest.approx(single_loss, abs=0.05), (loss, single_loss)


# -- checkpoints --------------------------------------------------------------------------------------
# 512 samples / 64 = 8 steps an epoch, 3 epochs; checkpoints every 3 steps fall mid-epoch.
RESUME = [*TINY, "trainer.epochs=3", "trainer.checkpoint_every=3", "trainer.keep_checkpoints=10", *FSDP]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """Saving in the loop: the runs compared with it save in the background (the default), the same state. Shared
    with tests/slurm/test_fsdp_on_slurm.py (reference_runs: run once a session)."""
    return reference_run(tmp_path_factory, [*RESUME, *ranks(2), "trainer.async_checkpoint=false"])


def test_checkpoints_are_dcp_directories_and_export_to_one_file(uninterrupted, tmp_path):
    step_dirs = sorted((uninterrupted / "checkpoints").iterdir())
    assert [p.name for p in step_dirs][-1] == "step_000000024"
    assert {".metadata", "__0_0.distcp", "__1_0.distcp", "loop.pt", "manifest.json"} <= {
        p.name for p in step_dirs[-1].iterdir()
    }
    out = tmp_path / "exported.pt"
    proc = subprocess.run(
        [sys.executable, "-m", "hpc_train.compute.checkpointing.export", str(uninterrupted), str(out)],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    exported, final = torch.load(out, weights_only=True), final_weights(uninterrupted)
    assert exported.keys() == final.keys() and all(torch.equal(exported[k], final[k]) for k in final)


def test_kill9_during_a_background_sharded_write_resumes_from_the_previous_checkpoint(uninterrupted, tmp_path):
    run_dir = tmp_path / "run"
    # Every rank's write pauses 2 s half-way in its background thread; the slowed steps go on meanwhile.
    proc = start_background(
        [*RESUME, *ranks(2)], run_dir, {"HPC_TRAIN_SLOW_CHECKPOINT": "2", "HPC_TRAIN_STEP_SLEEP": "0.8"}
    )
    try:  # step 3's save was installed while training went on; step 6's is half-written: its temporary dir exists
        wait_for(
            lambda: checkpoint_steps(run_dir) == [3] and list((run_dir / "checkpoints").glob(".step_000000006*")),
            120,
            "the second background write",
        )
    finally:
        kill_group(proc)
    assert checkpoint_steps(run_dir) == [3]
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    first = next(row for row in rows if row["kind"] == "checkpoint")
    assert first["step"] == 3 and first["async"] is True and first["blocked_s"] < first["total_s"] - 1, first
    proc = run_cli([*RESUME, *ranks(2)], run_dir)
    assert_ok(proc)
    assert not list((run_dir / "checkpoints").glob(".step_*")), "the killed write's temporary dir is removed"
    assert read_summary(run_dir)["resumed_from_step"] == 3
    assert_bit_identical(uninterrupted, run_dir)


def max_difference(a: Path, b: Path) -> float:
    wa, wb = final_weights(a), final_weights(b)
    assert wa.keys() == wb.keys()
    return max((wa[k].double() - wb[k].double()).abs().max().item() for k in wa)


@pytest.mark.parametrize(
    "first, second",
    [([*ranks(2)], [*ranks(3)]), ([*ranks(4), "strategy.replicate=2"], [*ranks(4)])],
    ids=["2-to-3-ranks", "hsdp-2x2-to-fsdp-4"],
)
def test_resharding_keeps_step_and_parameters(first, second, tmp_path):
    args = [
        *TINY,
        "trainer.batch_size=48",
        "trainer.max_steps=8",
        "trainer.checkpoint_every=4",
        "trainer.lr_schedule=constant",
        *FSDP,
    ]
    reference = tmp_path / "reference"
    assert_ok(run_cli([*args, *first], reference))
    run_dir = tmp_path / "run"  # continues the reference's checkpoint of step 4 at the second layout
    proc = run_cli([*args, *second, f"resume={reference / 'checkpoints' / 'step_000000004'}"], run_dir)
    assert_ok(proc)
    assert read_summary(run_dir)["resumed_from_step"] == 4 and "resharding" in proc.stdout + proc.stderr
    assert max_difference(reference, run_dir) <= 1e-4


def test_resharding_still_refuses_another_global_batch(uninterrupted, tmp_path):
    run_dir = tmp_path / "run"
    shutil.copytree(uninterrupted / "checkpoints", run_dir / "checkpoints")
    proc = run_cli([*RESUME, *ranks(4), "trainer.batch_size=32"], run_dir)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2 and "trainer.batch_size" in out and "Traceback" not in out, out


# -- the login side ---------------------------------------------------------------------------------------
def test_hsdp_layout_in_the_slurm_dry_run():
    proc = run_cli(
        [
            *TINY,
            *FSDP,
            "launcher=slurm",
            "resources.nodes=2",
            "resources.gpus_per_node=4",
            "strategy.replicate=nodes",
            "dry_run=true",
        ]
    )
    assert_ok(proc)
    assert "#SBATCH --nodes=2" in proc.stdout and "#SBATCH --ntasks-per-node=4" in proc.stdout
    assert "HSDP: 2 replicas x 4 shards" in proc.stdout
