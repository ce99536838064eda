"""Ranks started warm (forked by the tests' fork server, hpc_train.compute.runtime.fork_server) are the ranks a fresh
process would be: the same process state from inside, and the same run, bit for bit."""

import json
import os
import re
import signal
import subprocess
import sys

import pytest

from hpc_train.processes.warm_ranks import FORK_SERVER_VARIABLE, start_warm
from tests.support.cli import TINY, assert_bit_identical, assert_ok, read_summary, run_cli
from tests.support.paths import REPO
from tests.support.warm_ranks import forks, server_env

DDP = [*TINY, "trainer.batch_size=32", "trainer.max_steps=20", "trainer.epochs=null", "trainer.eval=false", "seed=7"]
DDP += ["strategy=ddp", "resources.gpus_per_node=2"]
# What a rank's state may differ in between two processes, fresh or warm: where it was written, and the draws of the
# generators a fresh process seeds from the operating system.
UNSEEDED = ("random", "torch_seed", "torch_draw")


@pytest.fixture
def server(fork_server):
    if fork_server is None:
        pytest.skip("HPC_TRAIN_TEST_FRESH_RANKS=1: no fork server in this session")
    return fork_server


def _rank_env(threads: str) -> dict:
    """A rank's environment as the local launcher gives it (the server's differs in OMP_NUM_THREADS)."""
    return dict(server_env(), OMP_NUM_THREADS=threads, RANK="0", WORLD_SIZE="1")


def _fresh_state(out, env) -> dict:
    with open(os.devnull, "w") as sink:
        command = [sys.executable, "-m", "tests.support.rank_state", str(out)]
        subprocess.run(command, env=env, cwd=REPO, stdout=sink, stderr=sink, check=True, timeout=120)
    return json.loads(out.read_text())


def _warm_state(server, out, env) -> dict:
    with open(os.devnull, "w") as sink:
        command = [sys.executable, "-m", "tests.support.rank_state", str(out)]
        rank = start_warm(str(server), command, env, {0: 0, 1: sink.fileno(), 2: sink.fileno()}, cwd=str(REPO))
        assert rank is not None, "the fork server said no"
        assert rank.wait(timeout=120) == 0
    return json.loads(out.read_text())


def test_a_warm_rank_is_a_fresh_process_from_inside(server, tmp_path):
    """Its argv, path, folder, umask, environment, signals, descriptors, stdio and threads; its generators seeded
    afresh."""
    env = _rank_env(threads="2")
    fresh = _fresh_state(tmp_path / "fresh.json", env)
    warm = _warm_state(server, tmp_path / "warm.json", env)
    again = _warm_state(server, tmp_path / "again.json", env)
    for key in fresh:
        if key not in UNSEEDED:
            assert warm[key] == fresh[key], f"{key}: warm {warm[key]!r}, fresh {fresh[key]!r}"
    assert warm["torch_threads"] == 2 and warm["blas_threads"] == [2]  # the server's are 1
    assert warm["random"][0] != again["random"][0], "Python's random is not reseeded after the fork"
    assert warm["random"][1] != again["random"][1], "numpy's global generator is not reseeded after the fork"
    assert warm["torch_seed"] != again["torch_seed"], "torch's default generator is not reseeded after the fork"


def test_a_warm_rank_ignores_what_the_launcher_ignores(server, tmp_path):
    """Signal dispositions cross as through exec: ignored stays ignored, a handler becomes the default."""
    previous = signal.signal(signal.SIGUSR2, signal.SIG_IGN)
    try:
        env = _rank_env(threads="1")
        fresh = _fresh_state(tmp_path / "fresh.json", env)
        warm = _warm_state(server, tmp_path / "warm.json", env)
    finally:
        signal.signal(signal.SIGUSR2, previous)
    assert fresh["signals"]["SIGUSR2"] == warm["signals"]["SIGUSR2"] == "ignored"


def test_a_launcher_that_imported_torch_still_gets_warm_ranks(server, tmp_path):
    """A launcher whose own imports set what a rank's imports set (torch._dynamo: TORCHINDUCTOR_CACHE_DIR, as in a
    test process that imported it) hands it on: the rank is served warm, and is what a fresh one is."""
    import torch._dynamo  # noqa: F401  # sets TORCHINDUCTOR_CACHE_DIR here, as it does in every rank

    env = dict(_rank_env(threads="1"), TORCHINDUCTOR_CACHE_DIR=os.environ["TORCHINDUCTOR_CACHE_DIR"])
    fresh = _fresh_state(tmp_path / "fresh.json", env)
    warm = _warm_state(server, tmp_path / "warm.json", env)
    assert warm["environ"] == fresh["environ"]


def _console(proc: subprocess.CompletedProcess, run_dir) -> list:
    """The run's console lines in words: its folder, ports and figures masked."""
    text = (proc.stdout + proc.stderr).replace(str(run_dir), "RUN_DIR")
    return [re.sub(r"\d+(\.\d+)?", "#", line) for line in text.splitlines()]


def test_a_warm_run_equals_the_same_run_fresh(server, tmp_path, monkeypatch):
    """Same config, fresh then warm: bit-identical parameters, the same losses step by step, the same console."""
    fresh, warm = tmp_path / "fresh", tmp_path / "warm"
    monkeypatch.delenv(FORK_SERVER_VARIABLE, raising=False)
    fresh_proc = run_cli(DDP, fresh)
    assert_ok(fresh_proc)
    before = forks(server)
    monkeypatch.setenv(FORK_SERVER_VARIABLE, str(server))
    warm_proc = run_cli(DDP, warm)
    assert_ok(warm_proc)
    assert forks(server) == before + 2, "the warm run's two ranks were not forked by the server"
    assert_bit_identical(fresh, warm)
    losses = [
        [row.get("train_loss") for row in map(json.loads, (d / "metrics.jsonl").read_text().splitlines())]
        for d in (fresh, warm)
    ]
    assert losses[0] == losses[1]
    for key in ("global_step", "train_loss", "final_parameter_digest"):
        assert read_summary(warm).get(key) == read_summary(fresh).get(key), key
    assert _console(warm_proc, warm) == _console(fresh_proc, fresh)
