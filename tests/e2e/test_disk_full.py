"""A full disk during a checkpoint's write, on a real (tmpfs) disk, as a user meets it: one message naming the
checkpoint, the folder and the fix, exit code 2, no traceback, no temporary file, the previous checkpoint kept; and the
same command resumes from it once space is freed. Single file (written in the background or not) and sharded (fsdp,
2 ranks); ddp's second rank learns of rank 0's failure. The points a tmpfs cannot fail (fsync, rename, the manifest,
the install) are injected in-process: tests/unit/test_checkpoint_disk_full.py.

The disk is sized from a probe run's checkpoint so that the first checkpoint fits and a later one does not, and the
model is big enough (a few hundred KiB) that the failure comes inside torch.save's stream, past the file's buffer:
there torch's zip writer raises a RuntimeError whose context is the OSError."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from hpc_train.records.rundir import read_jsonl
from tests.support.cli import TINY, assert_ok, checkpoint_steps, read_summary, run_cli, wait_for
from tests.support.paths import REPO

pytestmark = pytest.mark.usefixtures("warm_ranks")  # ranks forked warm (tests/support/warm_ranks.py)

# The command, scaled down: 30 steps, a checkpoint every 10, of a toy MLP on 16x16 images (about 600 KiB).
SINGLE = [
    *TINY,
    "strategy=single",
    "data.image_size=16",
    "trainer.max_steps=30",
    "trainer.checkpoint_every=10",
    "trainer.eval=false",
    "logger=jsonl",
]
FSDP = ["strategy=fsdp", "resources.gpus_per_node=2"]


def last_line(proc: subprocess.CompletedProcess) -> str:
    """What hpc-train printed last (its closing line is on stdout)."""
    return proc.stdout.strip().splitlines()[-1]


def checkpoint_size(run_dir: Path) -> int:
    return sum(f.stat().st_size for f in (run_dir / "checkpoints").rglob("*") if f.is_file()) // len(
        checkpoint_steps(run_dir)
    )


@pytest.fixture
def small_disk(tmp_path):
    """A tmpfs of a given size, which can grow (root only; the suite runs as root in CI)."""
    mount = tmp_path / "disk"
    mount.mkdir()

    def make(size_kib: int) -> Path:
        options = f"remount,size={size_kib}k" if mount.is_mount() else f"size={size_kib}k"
        proc = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(mount)], capture_output=True, text=True
        )
        if proc.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here (not root?): {proc.stderr.strip()}")
        return mount

    yield make
    subprocess.run(["umount", str(mount)], capture_output=True)


@pytest.fixture(scope="module")
def single_size(tmp_path_factory) -> int:
    """Bytes of one checkpoint of SINGLE (a probe run of 10 steps, on the ordinary disk)."""
    probe = tmp_path_factory.mktemp("probe") / "run"
    assert_ok(run_cli([*SINGLE, "trainer.max_steps=10"], probe))
    return checkpoint_size(probe)


def assert_one_message(proc: subprocess.CompletedProcess, run_dir: Path, name: str) -> None:
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2, out
    assert "Traceback" not in out and "No space left" not in out and "enforce fail" not in out, out
    assert f"no space left for checkpoint {name} in {run_dir / 'checkpoints'}" in out, out
    assert "The previous checkpoint is kept" in out and "trainer.keep_checkpoints" in out, out
    assert "then resume from it as the job's last line says" in out, out  # a run's last line, or a sweep job's
    assert last_line(proc).endswith(
        f"run the same command again (same hydra.run.dir={run_dir}) to resume from the last checkpoint"
    )
    assert not list((run_dir / "checkpoints").glob(".*")), "no temporary file is left"


@pytest.mark.parametrize("background", [True, False], ids=["async", "sync"])
def test_disk_full_in_a_streamed_checkpoint_is_one_message_and_resumes_once_space_is_freed(
    background, single_size, small_disk
):
    args = [*SINGLE, f"trainer.async_checkpoint={str(background).lower()}"]
    disk = small_disk(int(1.5 * single_size / 1024) + 128)  # the first checkpoint and the logs fit, a second does not
    run_dir = disk / "run"
    proc = run_cli(args, run_dir)
    assert_one_message(proc, run_dir, "step_000000020.ckpt")
    assert checkpoint_steps(run_dir) == [10], "the previous checkpoint stays"
    stopped = re.match(r"hpc-train: the job stopped mid-run at step (\d+): a rank refused to go on", last_line(proc))
    # in the loop: at step 20; in the background: at a step boundary after the write failed, before the run's end
    assert stopped and (20 <= int(stopped.group(1)) <= 30 if background else int(stopped.group(1)) == 20), proc.stdout
    small_disk(int(3.5 * single_size / 1024) + 128)  # space freed: the same command resumes from step 10
    again = run_cli(args, run_dir)
    assert_ok(again)
    assert read_summary(run_dir)["global_step"] == 30
    assert "resumed from" in (run_dir / "logs" / "rank0.log").read_text()


# ddp: rank 0 writes the file in the background and the other rank learns of the failure from it.
@pytest.mark.parametrize(
    "strategy", [["strategy=ddp", "resources.gpus_per_node=2"], FSDP], ids=["file-checkpoint", "sharded"]
)
def test_disk_full_with_two_ranks_is_one_message_and_keeps_the_previous_one(strategy, small_disk, tmp_path):
    args = [*SINGLE, "trainer.max_steps=12", "trainer.checkpoint_every=3", "trainer.keep_checkpoints=10", *strategy]
    probe = tmp_path / "probe"
    assert_ok(run_cli([*args, "trainer.max_steps=3"], probe))
    disk = small_disk(
        int(2.5 * checkpoint_size(probe) / 1024) + 128
    )  # two checkpoints and the logs fit, the third does not
    run_dir = disk / "run"
    proc = run_cli(args, run_dir)
    assert_one_message(proc, run_dir, "step_000000009.ckpt" if "strategy=ddp" in strategy else "step 9")
    assert checkpoint_steps(run_dir) == [3, 6], "the previous checkpoints stay"
    # The last line says the job stopped mid-run, at the step it reached: the checkpoint of step 9 failed in the
    # background, which the loop learns at a step boundary after it.
    stopped = re.match(r"hpc-train: the job stopped mid-run at step (\d+): a rank refused to go on", last_line(proc))
    assert stopped and 9 <= int(stopped.group(1)) <= 12, proc.stdout
    if "strategy=ddp" in strategy:  # then a refusal at the start, in the same run dir: not the earlier step
        for ckpt in (run_dir / "checkpoints").iterdir():
            ckpt.write_bytes(b"HPCTRAIN-CKPT 1 " + ckpt.read_bytes()[len(b"HPCTRAIN-CKPT 2 ") :])
        again = run_cli(args, run_dir)
        assert again.returncode == 2 and "older hpc-train" in again.stdout + again.stderr, again.stdout + again.stderr
        assert last_line(again).startswith("hpc-train: the job refused to start (exit code 2)"), again.stdout


# -- the run's records: metrics.jsonl, the rank logs, attempts.jsonl, summary.json ------------------------------------
RECORDS = [
    *TINY,
    "strategy=single",
    "trainer.epochs=100",
    "trainer.max_steps=400",
    "trainer.log_every=1",
    "trainer.checkpoint_every=0",
]
RECORD_FILES = ("metrics.jsonl", "rank0.log", "attempts.jsonl", "summary.json")


def fill(disk: Path) -> Path:
    """The disk filled to its last byte by a file of the test's own (removed again to free the space)."""
    filler = disk / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    try:
        for size in (1 << 20, 4096, 1):
            while True:
                try:
                    os.write(fd, b"\0" * size)
                except OSError:
                    break
    finally:
        os.close(fd)
    return filler


def every_line_whole(path: Path) -> list:
    """Every line of a JSONL record parses (no half line a full disk left for the next append to glue onto)."""
    text = path.read_text()
    assert text.endswith("\n"), text[-200:]
    return [json.loads(line) for line in text.splitlines()]


def test_a_full_disk_while_the_run_writes_its_records_is_one_message_and_nothing_written_is_lost(small_disk):
    disk = small_disk(8 * 1024)
    run_dir = disk / "run"
    out = disk.parent / "out.txt"
    with out.open("w") as printed:
        proc = subprocess.Popen(
            [sys.executable, "-m", "hpc_train.cli", *RECORDS, f"hydra.run.dir={run_dir}"],
            cwd=REPO,
            env=dict(os.environ, CUDA_VISIBLE_DEVICES="", HPC_TRAIN_STEP_SLEEP="0.02"),
            stdout=printed,
            stderr=subprocess.STDOUT,
        )
        try:
            wait_for(lambda: len(read_jsonl(run_dir / "metrics.jsonl")) >= 5, 120, "5 metrics rows")
            filler = fill(disk)
            assert proc.wait(timeout=120) == 2, out.read_text()
        finally:
            proc.kill()
    text = out.read_text()
    assert "Traceback" not in text and "Logging error" not in text and "Errno" not in text, text
    said = re.findall(r"no space left to write (\S+) in (\S+): ([^.]+)\. Fix: free space", text)
    assert said and said[0][0] in RECORD_FILES and "kept" in said[0][2], text
    assert "hpc-train:" in text.strip().splitlines()[-1], text  # the last line is hpc-train's
    steps = [row["step"] for row in every_line_whole(run_dir / "metrics.jsonl") if row["kind"] == "train"]
    assert len(steps) >= 5 and steps == list(range(1, len(steps) + 1)), steps
    every_line_whole(run_dir / "attempts.jsonl")
    report = subprocess.run(
        [sys.executable, "-m", "hpc_train.report.command", str(run_dir)], capture_output=True, text=True, cwd=REPO
    )
    # the report reads every record; its plot, on the same full disk, is one message too
    assert "Traceback" not in report.stderr and "COMPLETED" not in report.stdout, report.stdout + report.stderr
    assert report.returncode == 2 and "no plot written: no space left to write report.png" in report.stderr
    filler.unlink()  # space freed: the same command runs to its end, its records whole
    again = run_cli(RECORDS, run_dir)
    assert_ok(again)
    assert read_summary(run_dir)["global_step"] == 400
    assert [row["step"] for row in every_line_whole(run_dir / "metrics.jsonl") if row["kind"] == "train"][-1] == 400
