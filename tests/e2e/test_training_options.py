"""Trainer options and data sources end to end (real processes, tiny sizes)."""

import json

import pytest
from PIL import Image

from tests.support.cli import TINY, TINY_TRAINER, assert_ok, read_summary, run_cli

pytestmark = pytest.mark.usefixtures("warm_ranks")  # ranks forked warm (tests/support/warm_ranks.py)

SHORT = ["trainer.batch_size=16", "trainer.max_steps=4", "trainer.epochs=null", "strategy=single"]


@pytest.fixture(scope="module")
def plain_loss(tmp_path_factory):
    """The loss of the same 4 steps in fp32, SGD, a constant rate: what each option must change."""
    run_dir = tmp_path_factory.mktemp("plain")
    assert_ok(run_cli([*TINY, *SHORT], run_dir))
    return read_summary(run_dir)["train_loss"]


@pytest.mark.parametrize(
    "overrides, moves",
    [
        (["trainer.precision=bf16"], 0.05),
        (["trainer.precision=16"], 0.05),
        (["trainer.optimizer=adamw", "trainer.lr=0.001", "trainer.lr_schedule=step", "trainer.lr_step_every=2"], None),
        (["trainer.lr_schedule=cosine", "trainer.lr_warmup_steps=2"], None),
    ],
    ids=["bf16", "fp16", "adamw-step", "cosine-warmup"],
)
def test_trainer_options_train(overrides, moves, plain_loss, tmp_path):
    """Each option changes the computation: the loss differs from the fp32 SGD run's beyond rounding (a run that
    ignored the option would repeat it to the last bit: one process on the CPU is deterministic). Lower precision
    stays within `moves` of it."""
    proc = run_cli([*TINY, *SHORT, *overrides], tmp_path / "run")
    assert_ok(proc)
    summary = read_summary(tmp_path / "run")
    assert summary["global_step"] == 4
    assert abs(summary["train_loss"] - plain_loss) > 1e-5, (summary["train_loss"], plain_loss)
    if moves is not None:
        assert summary["train_loss"] == pytest.approx(plain_loss, abs=moves)


def test_channels_last_trains(tmp_path):
    proc = run_cli(
        [*TINY, *SHORT, "trainer.channels_last=true", "model=resnet18", "data.image_size=32"], tmp_path / "run"
    )
    assert_ok(proc)
    summary = read_summary(tmp_path / "run")
    assert summary["global_step"] == 4
    assert summary["train_loss"] == summary["train_loss"]  # not NaN


def test_lr_schedule_is_logged(tmp_path):
    proc = run_cli(
        [
            *TINY,
            *SHORT,
            "trainer.lr_schedule=step",
            "trainer.lr_step_every=2",
            "trainer.lr_step_gamma=0.5",
            "trainer.log_every=1",
            "trainer.lr=0.1",
        ],
        tmp_path / "run",
    )
    assert_ok(proc)
    lrs = [
        json.loads(line)["lr"]
        for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
        if '"train"' in line
    ]
    assert lrs == pytest.approx([0.1, 0.05, 0.05, 0.025])  # lr after steps 1..4


def test_imagefolder_trains_and_evaluates(tmp_path):
    root = tmp_path / "images"
    for split, count in (("train", 12), ("val", 4)):
        for label, colour in enumerate(((255, 0, 0), (0, 0, 255))):
            folder = root / split / f"class{label}"
            folder.mkdir(parents=True)
            for i in range(count):
                Image.new("RGB", (40, 40), colour).save(folder / f"{i}.png")
    proc = run_cli(
        [
            *TINY_TRAINER,
            *SHORT,
            "data=imagefolder",
            f"data.root={root}",
            "data.num_classes=2",
            "data.image_size=16",
            "data.num_workers=0",
            "trainer.eval=true",
        ],
        tmp_path / "run",
    )
    assert_ok(proc)
    summary = read_summary(tmp_path / "run")
    assert summary["data"] == "imagefolder" and summary["global_step"] == 4
    assert 0.0 <= summary["eval_accuracy"] <= 1.0


def test_local_multirun_writes_each_job_into_its_sweep_subdir(tmp_path):
    sweep = tmp_path / "sweep"
    proc = run_cli(["-m", *TINY, *SHORT, "seed=1,2", f"hydra.sweep.dir={sweep}"])
    assert_ok(proc)
    first, second = read_summary(sweep / "0"), read_summary(sweep / "1")
    assert first["global_step"] == second["global_step"] == 4
    assert first["train_loss"] != second["train_loss"]  # different seeds really ran
