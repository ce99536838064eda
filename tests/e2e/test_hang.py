"""A hung rank is found, named and shown: the hang watchdog and the second stop signal.

Real gloo ranks under the local launcher. A user step (tests/support/user_steps.py) or a dataset
(tests/support/hang_data.py) sleeps for an hour at a known point; the watchdog must end the job within
trainer.hang_timeout_s + 60 s with exit code 4, name the right ranks with the sleeping frame and
its line of code, and leave every rank's stacks in its log. The pure parts (the blame, the dump
parsers, the folded stack, the auto timeout) are checked on their own at the end.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hpc_train.records import hang, rundir
from tests.support import user_steps
from tests.support.cli import TINY, run_cli, wait_for
from tests.support.paths import REPO, SUPPORT

HANG_S = 6
DDP = ["strategy=ddp", "resources.gpus_per_node=2", "trainer.epochs=null", "trainer.max_steps=40", "trainer.eval=false"]
WATCHED = [f"trainer.hang_timeout_s={HANG_S}", "trainer.dist_timeout_s=120"]
LIMIT_S = HANG_S + 60  # the bar: the job ends within hang_timeout_s + 60 s


def step(name: str) -> str:
    return f"trainer.step={{_target_:tests.support.user_steps.{name},_partial_:true}}"


def hung_job(args, run_dir: Path) -> str:
    """Run the job; it must end as hung (exit code 4) within LIMIT_S; returns the watchdog's message."""
    started = time.monotonic()
    proc = run_cli(args, run_dir, timeout=LIMIT_S + 60)
    assert proc.returncode == rundir.EXIT_HUNG, proc.stdout + proc.stderr
    assert time.monotonic() - started < LIMIT_S
    # a run (not a sweep's job): its own command again resumes it
    assert proc.stdout.rstrip().endswith(
        f"; run the same command again (same hydra.run.dir={run_dir}) to resume from the last checkpoint"
    ), proc.stdout
    return hang_message(proc)


def hang_message(proc) -> str:
    start = proc.stderr.find("hpc-train: hang:")
    assert start >= 0, proc.stdout + proc.stderr
    return proc.stderr[start:]


def attempt_end(run_dir: Path) -> dict:
    return [r for r in rundir.read_attempts(run_dir) if r["event"] == "end"][-1]


def traceback_entry(path: Path, code: str, function: str) -> str:
    """A frame and its line of code as the message shows them (the line found by its text, so edits elsewhere in
    the file do not break the test)."""
    number = next(i for i, line in enumerate(path.read_text().splitlines(), 1) if line.strip() == code)
    return f'      File "{path}", line {number}, in {function}\n        {code}\n'


OWN_FRAME = re.escape(f'      File "{Path(hang.__file__).parents[1]}/')  # a frame of hpc_train's own code


def test_a_rank_that_sleeps_in_its_step_is_named_with_its_stack_and_its_peer_as_waiting(tmp_path):
    run_dir = tmp_path / "run"
    message = hung_job([*TINY, *DDP, *WATCHED, step("sleeps_on_rank_1")], run_dir)
    assert "; rank 1 stuck:" in message and "rank 1 (host " in message and "is stuck in forward at step 3:" in message
    culprit = message.split("rank 1 (host ")[1].split("rank 0 is waiting")[0]
    steps = SUPPORT / "user_steps.py"
    innermost = traceback_entry(steps, "time.sleep(seconds)", "sleeps_forever")
    assert f":\n{innermost}{traceback_entry(steps, 'sleeps_forever()', 'sleeps_on_rank_1')}" in culprit, culprit
    # Hydra's frames that call the step are folded; the stack ends at hpc_train's frame that called them
    assert re.search(rf"sleeps_forever\(\)\n      \(\d+ library frames?\)\n{OWN_FRAME}.*\n        \S.*\n\s*$", culprit)
    assert "rank 0 is waiting for it (backward at step 3): not the cause." in message
    assert "rank 0 (host" not in message  # the waiting rank is not blamed
    # every rank's stacks are in its own log; the attempt log and the failure record say it too
    assert "in sleeps_forever" in rundir.rank_log(run_dir, 1).read_text()
    assert "=== hpc-train: stacks of rank 0" in rundir.rank_log(run_dir, 0).read_text()
    end = attempt_end(run_dir)
    assert end["how"] == "hang" and "rank 1 (host" in end["detail"]
    assert json.loads(rundir.rank_error(run_dir, 1).read_text())["error"].startswith("hung in forward at step 3")
    assert not rundir.rank_error(run_dir, 0).exists()


def test_when_every_rank_sleeps_every_rank_is_named(tmp_path):
    run_dir = tmp_path / "run"
    message = hung_job([*TINY, *DDP, *WATCHED, step("sleeps_on_every_rank")], run_dir)
    assert "every rank is stuck:" in message and "waiting" not in message
    for rank in (0, 1):
        assert f"rank {rank} (host " in message
        assert "in sleeps_forever" in rundir.rank_log(run_dir, rank).read_text()
    assert message.count("in sleeps_forever") == 2


@pytest.mark.parametrize("workers", [0, 2])
def test_a_dataset_that_hangs_on_rank_1_is_named_with_the_reading_frame(workers, tmp_path):
    run_dir = tmp_path / "run"
    data = ["data.train={_target_:tests.support.hang_data.HangsOnRank1}", f"data.num_workers={workers}"]
    message = hung_job([*TINY, *DDP, *WATCHED, *data], run_dir)
    assert "; rank 1 stuck:" in message and "is stuck in data at step" in message
    reading = traceback_entry(SUPPORT / "hang_data.py", "time.sleep(3600)", "__getitem__")
    assert reading in message, message  # the worker's frame, or the rank's own
    if workers:
        assert "its child process (pid " in message
    assert "rank 0 is waiting for it" in message
    # no data loader worker outlives its rank (they sleep for an hour)
    time.sleep(1)
    left = subprocess.run(["pgrep", "-f", str(run_dir / rundir.JOB_CONFIG)], capture_output=True, text=True).stdout
    assert left.strip() == "", left


def start(args, run_dir: Path) -> subprocess.Popen:
    """The job in the background; its sleeping step marks each rank in run_dir's parent once it sleeps."""
    command = [sys.executable, "-m", "hpc_train.cli", *args, f"hydra.run.dir={run_dir}"]
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", **{user_steps.SLEEPING_DIR: str(run_dir.parent)})
    return subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_until_stuck(run_dir: Path, proc: subprocess.Popen) -> None:
    """Both ranks are in their third step (where the step sleeps, in forward): the step's own marks, not the progress
    records (with trainer.hang_timeout_s=null a rank publishes its record every 15 s); a launcher that died first fails
    at once, with its stderr, instead of a 90-s timeout."""

    def stuck() -> bool:
        if proc.poll() is not None:
            raise AssertionError(f"the launcher exited {proc.returncode} before the hang:\n{proc.stderr.read()}")
        return all((run_dir.parent / f"rank{r}").exists() for r in (0, 1))

    wait_for(stuck, 90, "both ranks in step 3")


def test_a_second_sigterm_stops_a_hung_step_at_once_with_every_ranks_stack(tmp_path):
    run_dir = tmp_path / "run"
    proc = start([*TINY, *DDP, "trainer.hang_timeout_s=null", step("sleeps_on_every_rank")], run_dir)
    wait_until_stuck(run_dir, proc)
    proc.send_signal(signal.SIGTERM)
    time.sleep(1.5)  # a repeat within 1 s is the same request (Ctrl-C reaches every rank twice)
    proc.send_signal(signal.SIGTERM)
    sent = time.monotonic()
    out, err = proc.communicate(timeout=60)
    assert time.monotonic() - sent < 15, "the second SIGTERM must stop the ranks at once"
    assert proc.returncode == rundir.EXIT_INTERRUPTED, err
    assert "received SIGTERM: checkpointing after the current step (a second SIGTERM" in err
    assert "rank 0: received SIGTERM again: stopping now, in forward at step 3" in err
    for rank in (0, 1):
        assert "in sleeps_forever" in rundir.rank_log(run_dir, rank).read_text()
    assert attempt_end(run_dir)["how"] == "stopped at once (received SIGTERM again)"


def test_a_step_that_does_not_end_within_the_grace_period_is_stopped_after_one_sigterm(tmp_path):
    run_dir = tmp_path / "run"
    proc = start(
        [*TINY, *DDP, "trainer.hang_timeout_s=null", "trainer.stop_grace_s=3", step("sleeps_on_every_rank")], run_dir
    )
    wait_until_stuck(run_dir, proc)
    proc.send_signal(signal.SIGTERM)
    sent = time.monotonic()
    out, err = proc.communicate(timeout=60)
    assert 3 <= time.monotonic() - sent < 20
    assert proc.returncode == rundir.EXIT_INTERRUPTED, err
    assert "no progress for 3 s after the stop request (trainer.stop_grace_s): stopping now" in err
    assert "in sleeps_forever" in rundir.rank_log(run_dir, 1).read_text()


def test_a_finished_run_leaves_done_records_and_no_hang(tmp_path):
    run_dir = tmp_path / "run"
    proc = run_cli([*TINY, *DDP, "trainer.max_steps=6", *WATCHED], run_dir, timeout=120)
    assert proc.returncode == 0, proc.stderr
    for rank in (0, 1):
        record = rundir.read_json(rundir.rank_progress(run_dir, rank))
        assert record["phase"] == hang.DONE and record["step"] == 6 and record["warm"] is True
    assert not rundir.hang_file(run_dir).exists()


def test_dist_timeout_must_exceed_the_hang_timeout_before_anything_runs(tmp_path):
    proc = run_cli([*TINY, "trainer.hang_timeout_s=600", "trainer.dist_timeout_s=300"], tmp_path / "run")
    assert proc.returncode == rundir.EXIT_REFUSED
    assert "invalid configuration for `trainer.dist_timeout_s`" in proc.stdout + proc.stderr
    assert "trainer.hang_timeout_s=600" in proc.stdout + proc.stderr
    assert not (tmp_path / "run" / rundir.LOGS).exists()
    bad = run_cli([*TINY, "trainer.hang_timeout_s=soon"], tmp_path / "run2")
    assert bad.returncode == rundir.EXIT_REFUSED and "`trainer.hang_timeout_s`" in bad.stdout + bad.stderr


# -- the pure parts --------------------------------------------------------------------------------------


READS = "import sys, time\nwhile True:\n    open(sys.executable, 'rb').read(4096)\n    time.sleep(0.05)"


def test_a_script_that_reads_before_its_first_line_is_starting_and_one_that_sleeps_is_not(monkeypatch):
    """Before its first line a script job's progress is what it reads (its imports); its children count too."""
    from hpc_train.compute.entry import script_job
    from hpc_train.compute.runtime import heartbeat

    marks, warm = [], [False]
    monkeypatch.setattr(heartbeat, "mark", lambda *args, **kwargs: marks.append(args))
    monkeypatch.setattr(heartbeat, "is_warm", lambda: warm[0])
    code = "import subprocess, sys, time\n{}print('ready', flush=True)\ntime.sleep(60)"
    sleeps = subprocess.Popen([sys.executable, "-c", code.format("")], stdout=subprocess.PIPE, text=True)
    spawns = f"subprocess.Popen([sys.executable, '-c', {READS!r}])\n"
    parent = subprocess.Popen([sys.executable, "-c", code.format(spawns)], stdout=subprocess.PIPE, text=True)
    try:
        for proc, advancing in ((sleeps, False), (parent, True)):
            assert proc.stdout.readline() == "ready\n"
            time.sleep(0.5)  # the child started (and read its interpreter) by now
            probe = script_job._StartupReads()
            probe()  # without a pid: nothing
            probe.pid = proc.pid
            probe()  # the first look sees the bytes read so far
            marks.clear()
            time.sleep(0.5)
            probe()
            assert marks == ([(hang.RUNNING,)] if advancing else [])
        warm[0] = True  # past the first line, only output and metrics rows are progress
        marks.clear()
        time.sleep(0.3)
        probe()
        assert marks == []
    finally:
        for proc in (sleeps, parent):
            for pid in script_job._bytes_read(proc.pid):
                if pid != proc.pid:
                    os.kill(pid, signal.SIGKILL)
            proc.kill()
            proc.wait()


def test_a_script_jobs_hung_rank_is_named_from_its_py_spy_stack(tmp_path):
    """Your own script: progress is its output (and hpc_train.log_metrics rows); stacks come from py-spy."""
    run_dir = tmp_path / "run"
    script = ["tests/support/scripts/ddp_allreduce.py", "--steps", "10", "--hang-rank", "1", "--hang-step", "3"]
    started = time.monotonic()
    proc = run_cli(["strategy=ddp", "resources.gpus_per_node=2", *WATCHED, f"hydra.run.dir={run_dir}", "--", *script])
    assert proc.returncode == rundir.EXIT_HUNG, proc.stderr
    assert time.monotonic() - started < LIMIT_S + 30
    message = hang_message(proc)
    assert "; rank 1 stuck:" in message and "is stuck in running (its last line: step 2: loss" in message
    assert traceback_entry(REPO / script[0], "time.sleep(3600)", "sleep_for_an_hour") in message, message
    assert "rank 0 is waiting for it (running): not the cause." in message  # py-spy: inside torch.distributed
    left = subprocess.run(["pgrep", "-f", "ddp_allreduce.py --steps 10 --hang-rank"], capture_output=True, text=True)
    assert left.stdout.strip() == ""
