"""Checkpoints and resume with real processes: kill -9, torn writes, corrupt files, incompatible configs.

The reference for every resumed run is the same command run without interruption; "equal"
means every tensor of the final model.pt is bit-identical (torch.equal), not merely close.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import shutil
import signal
import time
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
from tests.support.warm_ranks import fresh_env

# Ranks forked warm (tests/support/warm_ranks.py): the resume tests compare weights, which a warm start leaves
# bit-identical. The kill -9 and SIGTERM tests start theirs fresh (start_background), and so does the rank-failure test
# (fresh_env): how a dying rank's peer is stopped is what it checks.
pytestmark = pytest.mark.usefixtures("warm_ranks")

# 512 samples / batch 64 = 8 steps per epoch, 3 epochs; checkpoints every 3 steps fall mid-epoch.
RESUME = [*TINY, "trainer.epochs=3", "trainer.checkpoint_every=3", "trainer.keep_checkpoints=3"]
LAYOUTS = {
    "single": ["strategy=single"],
    "ddp": ["strategy=ddp", "resources.gpus_per_node=2"],
    # With more than two ranks the all-reduce's order of additions depends on DDP's bucket layout, which DDP changes
    # after the first backward of every process: a resumed attempt must take its steps on the same layout as the
    # uninterrupted run (hpc_train/compute/parallel/ddp.py, settle).
    "ddp-4": ["strategy=ddp", "resources.gpus_per_node=4"],
}


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """The reference runs, one per layout, computed once, saving in the loop: every resumed run below writes its
    checkpoints in the background (the default), so each comparison also shows both ways save the same state.
    The ddp run is shared with tests/slurm/test_requeue_slurm.py (reference_runs: run once a session)."""
    return {name: reference(tmp_path_factory, name) for name in LAYOUTS}


def reference(tmp_path_factory, layout: str) -> Path:
    """The uninterrupted run of `layout` (LAYOUTS), run once a session."""
    return reference_run(tmp_path_factory, [*RESUME, *LAYOUTS[layout], "trainer.async_checkpoint=false"])


@pytest.mark.parametrize("layout", ["single", "ddp-4"])
def test_kill9_during_a_background_checkpoint_write_keeps_the_previous_one(layout, uninterrupted, tmp_path):
    args = [*RESUME, *LAYOUTS[layout]]
    run_dir = tmp_path / "run"
    folder = run_dir / "checkpoints"
    # Writes pause 2 s half-way, in the background thread; the first attempt's steps are slowed so that the loop
    # goes on training meanwhile (3 steps between saves outlast a write).
    proc = start_background(args, run_dir, {"HPC_TRAIN_SLOW_CHECKPOINT": "2", "HPC_TRAIN_STEP_SLEEP": "0.8"})
    try:
        # The first checkpoint (step 3) completes in the background; then kill inside the second write.
        wait_for(
            lambda: (
                checkpoint_steps(run_dir) == [3] and any(p.name.startswith(".step_000000006") for p in folder.iterdir())
            ),
            120,
            "the second checkpoint write to start",
        )
    finally:
        kill_group(proc)
    first = next(
        json.loads(line)
        for line in (run_dir / "metrics.jsonl").read_text().splitlines()
        if json.loads(line)["kind"] == "checkpoint"
    )
    assert first["step"] == 3 and first["async"] is True
    assert first["blocked_s"] < first["total_s"] - 1, first  # the loop did not wait for the write
    torn = [p for p in folder.iterdir() if p.name.startswith(".")]
    assert torn, "the kill should have left the half-written temporary file"
    assert checkpoint_steps(run_dir) == [3], "a torn write must never appear under a checkpoint name"

    from hpc_train.compute.checkpointing.files import read_checkpoint

    assert read_checkpoint(folder / "step_000000003.ckpt")["state"]["global_step"] == 3

    proc = run_cli(args, run_dir)  # the same command, the same run dir: that is how a user resumes
    assert_ok(proc)
    summary = read_summary(run_dir)
    assert summary["global_step"] == 24 and summary["attempts"] == 2
    assert summary["resumed_from_step"] == 3, "resumed mid-epoch (8 steps an epoch), from the last complete checkpoint"
    assert "killed without a word" in proc.stdout  # the attempt log says how attempt 1 ended
    assert not [p for p in folder.iterdir() if p.name.startswith(".")], "the torn write's leftovers are removed"
    assert_bit_identical(uninterrupted[layout], run_dir)
    # metrics.jsonl holds each step once, as if the run had never stopped
    steps = [
        json.loads(line)["step"]
        for line in (run_dir / "metrics.jsonl").read_text().splitlines()
        if json.loads(line)["kind"] == "train"
    ]
    reference = [
        json.loads(line)["step"]
        for line in (uninterrupted[layout] / "metrics.jsonl").read_text().splitlines()
        if json.loads(line)["kind"] == "train"
    ]
    assert steps == reference


def test_corrupt_newest_checkpoint_falls_back_to_the_previous_one(uninterrupted, tmp_path):
    args = [*RESUME, *LAYOUTS["single"], "trainer.epochs=1"]  # stop after 8 steps: checkpoints 3, 6, 8
    run_dir = tmp_path / "run"
    assert_ok(run_cli(args, run_dir))
    assert checkpoint_steps(run_dir) == [3, 6, 8]
    newest = run_dir / "checkpoints" / "step_000000008.ckpt"
    newest.write_bytes(newest.read_bytes()[: newest.stat().st_size // 2])  # truncated, e.g. by a full disk
    middle = run_dir / "checkpoints" / "step_000000006.ckpt"
    data = bytearray(middle.read_bytes())
    data[-100] ^= 0xFF  # one flipped byte
    middle.write_bytes(bytes(data))

    proc = run_cli([*RESUME, *LAYOUTS["single"]], run_dir)  # now train all 3 epochs
    assert_ok(proc)
    assert "step_000000008.ckpt is truncated or corrupt" in proc.stdout
    assert "step_000000006.ckpt is truncated or corrupt" in proc.stdout
    assert read_summary(run_dir)["resumed_from_step"] == 3
    assert_bit_identical(uninterrupted["single"], run_dir)


def test_finished_run_rerun_changes_nothing_and_longer_run_continues(uninterrupted, tmp_path):
    run_dir = tmp_path / "run"
    args = [*RESUME, *LAYOUTS["single"], "trainer.epochs=2"]
    assert_ok(run_cli(args, run_dir))
    before = read_summary(run_dir)
    proc = run_cli(args, run_dir)
    assert_ok(proc)
    assert "already complete" in proc.stdout
    assert read_summary(run_dir) == before
    # Asking for 3 epochs continues from step 16 (the LR is constant in TINY, so the result is the
    # 3-epoch reference; with a cosine schedule its length would change).
    assert_ok(run_cli([*RESUME, *LAYOUTS["single"]], run_dir))
    assert read_summary(run_dir)["global_step"] == 24 and read_summary(run_dir)["resumed_from_step"] == 16
    assert_bit_identical(uninterrupted["single"], run_dir)


def test_resume_never_starts_over_and_keeps_the_old_checkpoints(uninterrupted, tmp_path):
    run_dir = tmp_path / "run"
    args = [*RESUME, *LAYOUTS["single"], "trainer.epochs=1"]
    assert_ok(run_cli(args, run_dir))
    proc = run_cli([*args, "resume=never"], run_dir)
    assert_ok(proc)
    summary = read_summary(run_dir)
    assert summary["resumed_from_step"] is None and summary["attempts"] == 1
    aside = [p for p in run_dir.iterdir() if p.name.startswith("checkpoints.replaced-")]
    assert len(aside) == 1 and sorted(p.name for p in aside[0].iterdir()) == [
        "step_000000003.ckpt",
        "step_000000006.ckpt",
        "step_000000008.ckpt",
    ]


@pytest.fixture(scope="module")
def one_epoch(tmp_path_factory) -> Path:
    """A single-process run of one epoch with its checkpoints: the source the resume tests below start from (each
    works on its own copy)."""
    source = tmp_path_factory.mktemp("one_epoch") / "run"
    assert_ok(run_cli([*RESUME, *LAYOUTS["single"], "trainer.epochs=1"], source))
    return source


def test_resume_from_an_explicit_checkpoint_path(uninterrupted, one_epoch, tmp_path):
    source = one_epoch
    args = [*RESUME, *LAYOUTS["single"]]
    run_dir = tmp_path / "continued"
    assert_ok(run_cli([*args, f"resume={source / 'checkpoints' / 'step_000000006.ckpt'}"], run_dir))
    assert read_summary(run_dir)["resumed_from_step"] == 6
    assert_bit_identical(uninterrupted["single"], run_dir)


@pytest.mark.parametrize(
    "change, expected",
    [
        (["model.hidden=32"], "model.hidden: checkpoint 64, this run 32"),
        (["trainer.batch_size=32"], "trainer.batch_size: checkpoint 64, this run 32"),
        (["strategy=ddp", "resources.gpus_per_node=2"], "strategy.name: checkpoint 'single', this run 'ddp'"),
    ],
)
def test_incompatible_checkpoint_is_refused_before_anything_runs(change, expected, one_epoch, tmp_path):
    run_dir = tmp_path / "run"
    shutil.copytree(one_epoch, run_dir)
    attempts_before = (run_dir / "attempts.jsonl").read_text()
    proc = run_cli([*RESUME, *LAYOUTS["single"], *change], run_dir)
    assert proc.returncode == 2
    assert "`resume`" in proc.stderr and expected in proc.stderr and "resume=never" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr
    assert (run_dir / "attempts.jsonl").read_text() == attempts_before, "nothing may have started"


def test_local_ddp_rank_failure_ends_the_job_quickly_with_its_traceback(tmp_path):
    """Quickly: rank 0 is not left in the step's collective until its timeout (trainer.dist_timeout_s); the time is
    counted from rank 1's failure (its log's last write, the traceback), not from the start of a loaded machine."""
    run_dir = tmp_path / "run"
    timeout_s = 20
    proc = run_cli(
        [*RESUME, *LAYOUTS["ddp"], f"trainer.dist_timeout_s={timeout_s}"],
        run_dir,
        env=fresh_env(HPC_TRAIN_FAIL_AT="1:5"),
    )
    ended = time.time()
    assert proc.returncode != 0
    after_failure = ended - (run_dir / "logs" / "rank1.log").stat().st_mtime
    assert after_failure < timeout_s, f"the job ended {after_failure:.1f} s after rank 1 failed: the collective timeout"
    # rank 0 fails too (its peer vanished) and may exit first: the launcher names the root cause
    assert "rank 1 failed first (InjectedFailure: HPC_TRAIN_FAIL_AT=1:5: rank 1 fails after 5 steps" in proc.stderr, (
        proc.stderr
    )
    rank1 = (run_dir / "logs" / "rank1.log").read_text()
    assert "Traceback" in rank1 and "InjectedFailure: HPC_TRAIN_FAIL_AT=1:5" in rank1
    assert not (run_dir / "summary.json").exists()


def rank_pid(launcher_pid: int, rank: int) -> int:
    """The pid of one local worker, found by its RANK variable among the launcher's children."""
    children = Path(f"/proc/{launcher_pid}/task/{launcher_pid}/children").read_text().split()
    for pid in children:
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        if f"RANK={rank}".encode() in environ:
            return int(pid)
    raise AssertionError(f"no worker with RANK={rank} among {children}")


COLLECTIVE_TIMEOUT_S = 120


def test_local_rank_killed_by_sigkill_ends_the_job_quickly(tmp_path):
    """A rank that dies without a word (OOM killer, kill -9) must not leave its peer waiting in a collective."""
    run_dir = tmp_path / "run"
    stderr_path = tmp_path / "launcher.err"
    with open(stderr_path, "w") as stderr:
        proc = start_background(
            [*RESUME, *LAYOUTS["ddp"], f"trainer.dist_timeout_s={COLLECTIVE_TIMEOUT_S}"],
            run_dir,
            {"HPC_TRAIN_STEP_SLEEP": "0.15"},
            stderr=stderr,
        )
    try:
        wait_for(lambda: checkpoint_steps(run_dir) != [], 120, "the first checkpoint")
        os.kill(rank_pid(proc.pid, 1), signal.SIGKILL)
        killed = time.monotonic()
        code = proc.wait(timeout=COLLECTIVE_TIMEOUT_S + 60)
    finally:
        if proc.poll() is None:
            kill_group(proc)
    elapsed = time.monotonic() - killed
    assert code != 0 and not (run_dir / "summary.json").exists()
    # Quickly: before the collective timeout, which a peer left waiting would sit out (any load ends well before it).
    assert elapsed < COLLECTIVE_TIMEOUT_S, f"the job ended {elapsed:.0f} s after a rank died: the collective timeout"
    said = stderr_path.read_text()
    assert re.search(r"rank 1 \(pid \d+\) was killed by SIGKILL \(signal 9\).*; stopping the other ranks", said), said


def logged_steps(run_dir: Path) -> list:
    """The train steps metrics.jsonl holds so far (a line being written is skipped)."""
    path = run_dir / "metrics.jsonl"
    steps = []
    for line in path.read_text().splitlines() if path.exists() else []:
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if record.get("kind") == "train":
            steps.append(int(record["step"]))
    return steps


def test_sigterm_to_the_local_launcher_checkpoints_and_a_rerun_continues(uninterrupted, tmp_path):
    """A local stand-in for preemption: every rank checkpoints at the same step boundary and stops.

    No periodic checkpoint falls inside the run (checkpoint_every beyond its 24 steps), so the one checkpoint
    there is after the stop is the stop's own, whenever the signal lands."""
    args = [*(a for a in RESUME if not a.startswith("trainer.checkpoint_every=")), *LAYOUTS["ddp"]]
    args += ["trainer.checkpoint_every=1000", "trainer.log_every=1"]
    run_dir = tmp_path / "run"
    proc = start_background(args, run_dir, {"HPC_TRAIN_STEP_SLEEP": "0.15"})
    wait_for(lambda: 2 <= max(logged_steps(run_dir), default=0), 120, "step 2 in metrics.jsonl")
    proc.send_signal(signal.SIGTERM)  # the launcher forwards it to every rank
    assert proc.wait(timeout=60) == 3
    stopped_at = max(checkpoint_steps(run_dir))
    assert checkpoint_steps(run_dir) == [stopped_at] and 2 <= stopped_at < 24, "the stop must write its own checkpoint"
    endings = [json.loads(line) for line in (run_dir / "attempts.jsonl").read_text().splitlines()]
    assert (
        endings[-1]["event"] == "end"
        and endings[-1]["how"].startswith("terminated")
        and endings[-1]["step"] == stopped_at
    )

    assert_ok(run_cli(args, run_dir))
    assert read_summary(run_dir)["resumed_from_step"] == stopped_at
    assert_bit_identical(uninterrupted["ddp"], run_dir)


OTHER_STRATEGIES = {
    "dp": ["strategy=dp", "resources.gpus_per_node=2"],
    "model_parallel": ["strategy=model_parallel", "strategy.stages=2"],
    "pipeline": ["strategy=pipeline", "strategy.stages=2", "strategy.chunks=2"],
    "hybrid": ["strategy=hybrid", "strategy.stages=2", "resources.gpus_per_node=4"],
    "pipelining": ["strategy=pipeline", "strategy.engine=pipelining", "resources.gpus_per_node=2", "strategy.chunks=2"],
}


@pytest.mark.parametrize("name", sorted(OTHER_STRATEGIES))
def test_every_strategy_resumes_after_a_crash_bit_identical(name, tmp_path):
    args = [*RESUME, *OTHER_STRATEGIES[name], "trainer.epochs=1"]
    reference = tmp_path / "reference"
    assert_ok(run_cli(args, reference))
    run_dir = tmp_path / "run"
    crashed = run_cli(args, run_dir, env=dict(os.environ, HPC_TRAIN_FAIL_AT="0:5"))
    assert crashed.returncode != 0 and checkpoint_steps(run_dir) == [3]
    assert_ok(run_cli(args, run_dir))
    assert read_summary(run_dir)["resumed_from_step"] == 3
    weights = sorted(p.name for p in reference.glob("model*.pt"))
    assert weights and weights == sorted(p.name for p in run_dir.glob("model*.pt"))
    for name in weights:  # the pipelining engine writes one file per stage
        a, b = torch.load(reference / name, weights_only=True), torch.load(run_dir / name, weights_only=True)
        assert all(torch.equal(a[k], b[k]) for k in a), f"{name} differs after resume"


# -- untrusted checkpoints ------------------------------------------------------------------
class RunsCode:
    """Pickles as a call of open(marker, "w"): loading it unsafely creates the marker file."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (open, (str(self.marker), "w"))


def forge(real: Path, payload: object, path: Path) -> Path:
    """A file with a valid header, digest and fingerprint (copied from a real checkpoint) around `payload`."""
    with open(real, "rb") as handle:
        version = handle.readline().split()[1]
        fingerprint_line = handle.readline()
    buffer = io.BytesIO()
    torch.save(payload, buffer)
    body = fingerprint_line + buffer.getvalue()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"HPCTRAIN-CKPT %s %s\n" % (version, hashlib.sha256(body).hexdigest().encode()) + body)
    return path


def test_a_forged_checkpoint_runs_nothing_and_is_refused_in_one_message(one_epoch, tmp_path):
    from hpc_train.compute.checkpointing.files import CheckpointRefused, newest_valid, read_checkpoint

    real = one_epoch / "checkpoints" / "step_000000008.ckpt"
    marker = tmp_path / "pwned"
    forged = forge(real, {"format": 2, "state": RunsCode(marker)}, tmp_path / "shared" / "step_000000008.ckpt")
    # The forgery is a real threat: what an unsafe load of the same bytes would do.
    control = tmp_path / "control-marker"
    torch.load(
        io.BytesIO(
            forge(real, {"state": RunsCode(control)}, tmp_path / "control.ckpt").read_bytes().split(b"\n", 2)[2]
        ),
        weights_only=False,
    )
    assert control.exists()

    proc = run_cli([*RESUME, *LAYOUTS["single"], f"resume={forged}"], tmp_path / "run")
    output = proc.stdout + proc.stderr
    assert proc.returncode == 2, output
    assert not marker.exists(), "loading the checkpoint ran code from it"
    assert (
        f"refusing to load checkpoint {forged}" in output and "io.open" in output and "Nothing in it was run" in output
    ), output
    assert "Traceback" not in output
    assert not (tmp_path / "run" / "summary.json").exists()

    # In a run dir, a forged newest checkpoint is refused, not skipped for the older valid one.
    folder = tmp_path / "dir" / "checkpoints"
    folder.mkdir(parents=True)
    (folder / "step_000000006.ckpt").write_bytes((one_epoch / "checkpoints" / "step_000000006.ckpt").read_bytes())
    forged.rename(folder / forged.name)
    with pytest.raises(CheckpointRefused):
        newest_valid(folder)
    assert not marker.exists()
    assert read_checkpoint(folder / "step_000000006.ckpt")["state"]["global_step"] == 6


def test_a_checkpoint_of_the_older_format_is_refused_with_what_to_do(one_epoch, tmp_path):
    run_dir = tmp_path / "run"
    (run_dir / "checkpoints").mkdir(parents=True)
    for ckpt in (one_epoch / "checkpoints").iterdir():
        data = ckpt.read_bytes()
        assert data.startswith(b"HPCTRAIN-CKPT 2 ")
        (run_dir / "checkpoints" / ckpt.name).write_bytes(
            b"HPCTRAIN-CKPT 1 " + data[len(b"HPCTRAIN-CKPT 2 ") :]
        )  # digest still valid
    args = [*RESUME, *LAYOUTS["single"]]
    proc = run_cli(args, run_dir)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 2, output
    assert "was written by an older hpc-train (checkpoint format 1" in output and "resume=never" in output, output
    assert "Traceback" not in output and not (run_dir / "summary.json").exists()
    assert_ok(run_cli([*args, "resume=never"], run_dir))  # the way out the message names


def test_a_ddp_checkpoint_resumes_on_fewer_ranks_equal_to_the_uninterrupted_run(tmp_path):
    """ddp's checkpoint is one replica's state: 2 ranks' step-3 checkpoint continues on 1 rank over the same global
    batch (the per-rank batch doubles) and ends where the 2-rank run ends, within 1e-4 (the sums round differently)."""
    base = [*TINY, "trainer.epochs=null", "trainer.eval=false", "strategy=ddp", "trainer.checkpoint_every=3"]
    whole, split = tmp_path / "whole", tmp_path / "split"
    assert_ok(run_cli([*base, "trainer.max_steps=6", "resources.gpus_per_node=2"], whole))
    step3 = whole / "checkpoints" / "step_000000003.ckpt"  # continued on 1 rank in another run dir
    assert_ok(run_cli([*base, "trainer.max_steps=6", "resources.gpus_per_node=1", f"resume={step3}"], split))
    summary = read_summary(split)
    assert summary["resumed_from_step"] == 3 and summary["world_size"] == 1
    a, b = final_weights(whole), final_weights(split)
    assert a.keys() == b.keys() and max((a[k] - b[k]).abs().max().item() for k in a) <= 1e-4
