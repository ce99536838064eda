"""examples/user_project: a researcher's own model, dataset and config dir, run as they would run it.

Every command runs from the project's own folder (that is where `import mynet` works) with
`--config-dir my_conf`, exactly as the README's "Your own model and data" shows.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from tests.support.cli import assert_ok, read_summary, run_cli
from tests.support.paths import REPO
from tests.support.warm_ranks import fresh_env

# Ranks forked warm (tests/support/warm_ranks.py); the kill -9 test's run starts fresh ranks (fresh_env), in the
# process group it kills.
pytestmark = pytest.mark.usefixtures("warm_ranks")

PROJECT = REPO / "examples" / "user_project"
USER = [
    "--config-dir",
    "my_conf",
    "model=tinynet",
    "data=blobs",
    "trainer.progress=false",
    "trainer.lr_schedule=constant",
    "trainer.weight_decay=0",
]
assert USER[:2] == ["--config-dir", "my_conf"]  # Hydra's flags come before the overrides
# 512 samples / batch 64 = 8 steps an epoch; 2 epochs.
TRAIN = [*USER, "trainer.epochs=2", "trainer.batch_size=64", "trainer.lr=0.1"]


def run_user(args, run_dir: Path, **kwargs) -> subprocess.CompletedProcess:
    return run_cli(args, run_dir, cwd=PROJECT, **kwargs)


def final_loss(run_dir: Path) -> float:
    return read_summary(run_dir)["train_loss"]


@pytest.fixture(scope="module")
def single_run(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("single")
    assert_ok(run_user([*TRAIN, "strategy=single"], run_dir))
    return run_dir


@pytest.mark.parametrize(
    "strategy",
    [
        ["strategy=ddp", "resources.gpus_per_node=2"],
        ["strategy=pipeline", "strategy.split_points=[head]", "strategy.chunks=4"],
        ["strategy=model_parallel", "strategy.split_points=[mix,head]"],
        [
            "strategy=pipeline",
            "strategy.engine=pipelining",
            "strategy.split_points=[head]",
            "resources.gpus_per_node=2",
        ],
    ],
    ids=["ddp", "pipeline-split-at-head", "model-parallel-3-stages", "pipelining-engine"],
)
def test_user_model_trains_to_the_same_loss_under_every_strategy(strategy, single_run, tmp_path):
    """No batch norm in TinyNet: every strategy computes the single process's steps, to rounding."""
    assert_ok(run_user([*TRAIN, *strategy], tmp_path / "run"))
    summary = read_summary(tmp_path / "run")
    assert summary["model"] == "tinynet" and summary["data"] == "blobs"
    assert final_loss(tmp_path / "run") == pytest.approx(final_loss(single_run), rel=1e-4)
    assert summary["eval_loss"] == pytest.approx(read_summary(single_run)["eval_loss"], rel=1e-4)
    assert summary["eval_accuracy"] is not None


def test_the_python_api_runs_the_user_project_to_the_same_loss(single_run, tmp_path, monkeypatch):
    """hpc_train.run from the project's folder (where `import mynet` works), as a notebook there would."""
    import hpc_train

    monkeypatch.chdir(PROJECT)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    overrides = [o for o in TRAIN if o not in ("--config-dir", "my_conf")] + [
        "strategy=ddp",
        "resources.gpus_per_node=2",
    ]
    summary = hpc_train.run(overrides, config_dir=PROJECT / "my_conf", run_dir=tmp_path / "api", quiet=True)
    assert summary["model"] == "tinynet" and summary["world_size"] == 2
    assert summary["train_loss"] == pytest.approx(final_loss(single_run), rel=1e-4)


def test_user_model_learns(single_run):
    assert read_summary(single_run)["eval_accuracy"] > 0.8, "4 well-separated blobs"


def test_kill9_and_rerun_is_bit_identical_with_the_user_model(single_run, tmp_path):
    args = [*TRAIN, "strategy=single", "trainer.checkpoint_every=3"]
    run_dir = tmp_path / "run"
    env = fresh_env(CUDA_VISIBLE_DEVICES="", HPC_TRAIN_STEP_SLEEP="0.2")
    proc = subprocess.Popen(
        [sys.executable, "-m", "hpc_train.cli", *args, f"hydra.run.dir={run_dir}"],
        cwd=PROJECT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        end = time.monotonic() + 120
        while time.monotonic() < end and len(list((run_dir / "checkpoints").glob("step_*.ckpt"))) < 2:
            time.sleep(0.05)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # the launcher and its rank, no chance to clean up
        proc.wait(timeout=30)
    killed_at = max(int(p.name[5:14]) for p in (run_dir / "checkpoints").glob("step_*.ckpt"))
    assert 0 < killed_at < 16
    assert_ok(run_user(args, run_dir))
    assert read_summary(run_dir)["resumed_from_step"] == killed_at
    reference = torch.load(single_run / "model.pt", weights_only=True)
    resumed = torch.load(run_dir / "model.pt", weights_only=True)
    assert reference.keys() == resumed.keys()
    assert all(torch.equal(reference[k], resumed[k]) for k in reference), (
        "resumed weights differ from the uninterrupted run's"
    )


@pytest.mark.parametrize(
    "overrides, key, where",
    [
        (
            ["model._target_=mynett.TinyNet"],
            "model._target_",
            "login",
        ),  # no such package: refused before anything starts
        (["model._target_=mynet.TinyNett"], "model", "job"),  # the package exists, the class does not
        (["+model.widht=8"], "model", "job"),  # a keyword TinyNet does not take
        (
            ["data.dim=5", "model.in_features=8"],
            "data.train",
            "job",
        ),  # the dataset yields 5 features, the model wants 8
        (["trainer.loss._target_=torch.nn.MSELoss"], "trainer.loss", "job"),  # (N, 4) outputs against (N,) labels
    ],
)
def test_bad_user_code_is_refused_with_the_key_and_no_traceback(overrides, key, where, tmp_path):
    run_dir = tmp_path / "run"
    proc = run_user([*TRAIN, "strategy=ddp", "resources.gpus_per_node=2", *overrides], run_dir)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2, out
    assert f"`{key}" in out and "Fix:" in out, out
    assert "Traceback" not in out, out
    assert not (run_dir / "checkpoints").exists(), "nothing may train"
    if where == "login":
        assert not (run_dir / "job_config.yaml").exists()


def test_a_loss_function_with_partial_and_no_accuracy_for_regression(tmp_path):
    """Float targets and torch.nn.functional.mse_loss: eval_loss is reported, eval_accuracy is null."""
    loss = ["trainer.loss._target_=torch.nn.functional.mse_loss", "+trainer.loss._partial_=true"]
    proc = run_user(
        [*USER, "data=regression", *loss, "trainer.epochs=1", "strategy=single", "trainer.lr=0.01"], tmp_path / "run"
    )
    assert_ok(proc)
    summary = read_summary(tmp_path / "run")
    assert summary["eval_loss"] is not None and summary["eval_accuracy"] is None
