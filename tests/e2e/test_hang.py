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

from hpc_train import hang, rundir
from hpc_train.compute.runtime import pyspy
from tests.support.cli import TINY, run_cli, wait_for
from tests.support.paths import REPO, SUPPORT

HANG_S = 6
DDP = ["strategy=ddp", "resources.gpus_per_node=2", "trainer.epochs=null", "trainer.max_steps=40", "trainer.eval=false"]
WATCHED = [f"trainer.hang_timeout_s={HANG_S}", "trainer.dist_timeout_s=120"]
LIMIT_S = HANG_S + 60  # the bar: the job ends within hang_timeout_s + 60 s


def step(name: str) -> str:
    return f"trainer.step={{_target_:tests.support.user_steps.{name},_partial_:true}}"


def hung_job(args, run_dir: Path) -> str:
    """Run the job; it must end as hung (exit code 4) within the issue's bar; returns the watchdog's message."""
    started = time.monotonic()
    proc = run_cli(args, run_dir, timeout=LIMIT_S + 60)
    assert proc.returncode == rundir.EXIT_HUNG, proc.stdout + proc.stderr
    assert time.monotonic() - started < LIMIT_S
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


OWN_FRAME = re.escape(f'      File "{Path(hang.__file__).parent}/')  # a frame of hpc_train's own code


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
    command = [sys.executable, "-m", "hpc_train.cli", *args, f"hydra.run.dir={run_dir}"]
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
    return subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_until_stuck(run_dir: Path, proc: subprocess.Popen) -> None:
    """Both ranks are in their third step (where the step sleeps); a launcher that died first fails at once, with
    its stderr, instead of a 90-s timeout."""

    def stuck() -> bool:
        if proc.poll() is not None:
            raise AssertionError(f"the launcher exited {proc.returncode} before the hang:\n{proc.stderr.read()}")
        records = [rundir.read_json(rundir.rank_progress(run_dir, r)) or {} for r in (0, 1)]
        return all(r.get("step") == 3 and r.get("phase") == hang.FORWARD for r in records)

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
    proc = start([*TINY, *DDP, "trainer.hang_timeout_s=null", "trainer.stop_grace_s=3", step("sleeps_on_every_rank")], run_dir)
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
def record(rank: int, step: int, phase: str, since: float = 100.0) -> hang.RankProgress:
    return hang.RankProgress(rank, "node", 1000 + rank, 1, "a", step, phase, since, since)


def test_the_ranks_behind_are_blamed_and_the_ones_ahead_wait():
    records = {0: record(0, 3, hang.BACKWARD), 1: record(1, 3, hang.FORWARD), 2: record(2, 3, hang.COLLECTIVE)}
    verdict = hang.diagnose(records, {}, now=130.0)
    assert verdict.culprits == [1] and verdict.waiting == [0, 2] and verdict.stalled_s == 30.0
    same = {r: record(r, 4, hang.DATA) for r in range(3)}
    assert hang.diagnose(same, {}, now=200.0).culprits == [0, 1, 2]
    earlier_step = {0: record(0, 5, hang.DATA), 1: record(1, 4, hang.OPTIMIZER)}
    assert hang.diagnose(earlier_step, {}, now=200.0).culprits == [1]


def test_a_stack_inside_torch_distributed_counts_as_waiting():
    stacks = {0: hang.RankStacks(1, {1: [hang.Frame("/x/torch/distributed/distributed_c10d.py", 3, "all_reduce")]})}
    records = {0: record(0, 3, hang.FORWARD), 1: record(1, 3, hang.FORWARD)}
    verdict = hang.diagnose(records, stacks, now=200.0)
    assert verdict.culprits == [1] and verdict.waiting == [0]


def test_a_rank_importing_torch_distributed_is_not_waiting_in_a_collective():
    """A script job starting up on a loaded machine (the stacks py-spy took, shortened): rank 1 runs the module-level
    code of torch.distributed.tensor (DDP's constructor imports it), rank 0 waits for it in DDP's first collective."""
    torch_dir = "/venv/lib/python3.11/site-packages/torch"
    Frame = hang.Frame
    importing = [
        Frame(f"{torch_dir}/distributed/tensor/_ops/_pointwise_ops.py", 119, "_register_single_dim_pointwise"),
        Frame(f"{torch_dir}/distributed/tensor/_ops/_pointwise_ops.py", 580, "<module>"),
        Frame("<frozen importlib._bootstrap>", 241, "_call_with_frames_removed"),
        Frame("<frozen importlib._bootstrap_external>", 940, "_LoaderBasics.exec_module"),
        Frame(f"{torch_dir}/nn/parallel/distributed.py", 842, "DistributedDataParallel.__init__"),
        Frame("/work/ddp_allreduce.py", 49, "main"),
    ]
    waiting = [
        Frame(f"{torch_dir}/distributed/utils.py", 299, "_verify_param_shape_across_processes"),
        Frame(f"{torch_dir}/nn/parallel/distributed.py", 1064, "DistributedDataParallel.__init__"),
        Frame("/work/ddp_allreduce.py", 49, "main"),
    ]
    elsewhere = [Frame("/python3.11/dataclasses.py", 433, "_create_fn"), *importing[2:]]  # importing torch._dynamo
    assert not hang.in_collective(hang.RankStacks(1, {1: importing})) and hang.in_collective(hang.RankStacks(1, {1: waiting}))
    records = {r: record(r, 0, hang.RUNNING) for r in (0, 1)}
    stacks = {0: hang.RankStacks(1, {1: waiting}), 1: hang.RankStacks(1, {1: importing})}
    verdict = hang.diagnose(records, stacks, now=200.0)
    assert verdict.culprits == [1] and verdict.waiting == [0]
    # both still starting: neither waits for the other (rank 0 was blamed alone, rank 1 called waiting)
    stacks = {0: hang.RankStacks(1, {1: elsewhere}), 1: hang.RankStacks(1, {1: importing})}
    assert hang.diagnose(records, stacks, now=200.0).culprits == [0, 1]


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


def test_a_dump_is_read_back_from_the_log_by_its_stamp():
    stamp = hang.stamp(1234.5)
    text = "\n".join(
        [
            "old lines",
            hang.STACKS_BEGIN.format(rank=1, pid=7, host="n1", main=0xABC, stamp=stamp),
            "Current thread 0x0000000000000def (most recent call first):",
            '  File "/x/heartbeat.py", line 9 in _run',
            "",
            "Thread 0x0000000000000abc (most recent call first):",
            '  File "/x/user.py", line 5 in sleepy',
            '  File "/x/trainer.py", line 7 in fit',
            hang.WORKER_HEADER.format(pid=42, rank=1),
            "Thread 0x0000000000000111 (most recent call first):",
            '  File "/x/thread.py", line 1 in serve',
            "Current thread 0x0000000000000222 (most recent call first):",
            '  File "/x/data.py", line 2 in __getitem__',
            hang.STACKS_END.format(rank=1, stamp=stamp),
        ]
    )
    stacks = hang.parse_stacks(text, 1, stamp)
    assert stacks.main == [hang.Frame("/x/user.py", 5, "sleepy"), hang.Frame("/x/trainer.py", 7, "fit")]
    assert str(stacks.main[0]) == 'File "/x/user.py", line 5, in sleepy'  # as a traceback names it
    assert stacks.workers == {42: [hang.Frame("/x/data.py", 2, "__getitem__")]}
    assert hang.parse_stacks(text, 1, hang.stamp(99.0)) is None  # another request's dump is not this one


TRAIN_PY = """\
def read_shard(handle):
    return handle.read()  # a dead file system


def collate(batch):
    return [read_shard(item) for item in batch]
"""
TORCH = "/venv/lib/python3.11/site-packages/torch/utils/data"
PY_SPY_DUMP = f"""\
Process 4242: /venv/bin/python {{script}} --epochs 3
Python v3.11.7 (/usr/bin/python3.11)

Thread 4242 (idle): "MainThread"
    read_shard ({{script}}:2)
    collate ({{script}}:6)
    fetch ({TORCH}/_utils/fetch.py:55)
    _next_data ({TORCH}/dataloader.py:757)
    __next__ ({TORCH}/dataloader.py:708)
    main ({{script}}:30)
Thread 4250 (idle): "pin_memory"
    wait (/usr/lib/python3.11/threading.py:324)
"""


def test_a_py_spy_dump_is_shown_as_a_traceback_with_each_line_of_code(tmp_path):
    """A script job's stacks: py-spy's dump, rewritten, parsed back, and shown with the script's lines of code."""
    script = tmp_path / "train.py"
    script.write_text(TRAIN_PY)  # line 30 lies beyond its end: no line of code, as in a traceback
    stamp = hang.stamp(1234.5)
    head = hang.STACKS_BEGIN.format(rank=1, pid=4242, host="n1", main=4242, stamp=stamp)
    dump = pyspy.rewrite(PY_SPY_DUMP.format(script=script), 4242, 1)
    stacks = hang.parse_stacks("\n".join([head, *dump, hang.STACKS_END.format(rank=1, stamp=stamp)]), 1, stamp)
    assert stacks.main[0] == hang.Frame(str(script), 2, "read_shard")
    records = {0: record(0, 0, hang.RUNNING), 1: record(1, 0, hang.RUNNING)}
    message = hang.describe(hang.Verdict([1], [0], [], 30.0), records, {0: None, 1: stacks}, 6, tmp_path)
    assert (
        f'      File "{script}", line 2, in read_shard\n'
        "        return handle.read()  # a dead file system\n"
        f'      File "{script}", line 6, in collate\n'
        "        return [read_shard(item) for item in batch]\n"
        "      (3 library frames)\n"
        f'      File "{script}", line 30, in main\n'
        "  rank 0 is waiting for it (running): not the cause.\n"
    ) in message, message


def test_a_folded_stack_keeps_where_it_waits_and_ends_at_hpc_trains_call():
    own = f"{Path(hang.__file__).parent}/compute/training/trainer.py"
    library, user = hang.Frame(f"{TORCH}/dataloader.py", 1, "get"), hang.Frame("/home/me/data.py", 9, "load")
    outer = [hang.Frame(own, 5, "fit"), hang.Frame(own, 9, "run")]
    assert hang.fold([library, library, user, library, *outer]) == [library, 1, user, 1, outer[0]]
    assert hang.fold([user, library, library]) == [user]  # library frames folded only between two shown
    assert hang.fold([*outer, user, outer[0]]) == [*outer, user, outer[0]]  # stuck in hpc_train's own code
    assert hang.fold([user] * 20) == [user] * hang.SHOWN_FRAMES


def test_the_auto_timeout_is_five_minutes_or_twenty_steps_below_the_process_group_timeout():
    assert hang.timeout_s("auto", None, 1800) == 300
    assert hang.timeout_s("auto", 30.0, 1800) == 600
    assert hang.timeout_s("auto", 120.0, 1800) == pytest.approx(1620)  # capped at 0.9 x dist_timeout_s
    assert hang.timeout_s(45, 120.0, 1800) == 45 and hang.timeout_s(None, 1.0, 1800) is None


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


def test_the_rank_that_died_first_is_blamed_by_its_time_of_death_not_its_report(tmp_path):
    from hpc_train.rank_errors import note_time_of_death, read_records, root_cause, write_error_record

    culprit = ValueError("the real cause")
    note_time_of_death(culprit)  # it left the step first ...
    time.sleep(0.05)
    peer = RuntimeError("Connection closed by peer")
    write_error_record(tmp_path, 0, peer)  # ... but its peer's record is written first
    time.sleep(0.05)
    write_error_record(tmp_path, 1, culprit)
    records = read_records(tmp_path, 2, since=0.0)
    assert records[1]["time"] < records[0]["time"]
    assert root_cause([(0, 1), (1, 1)], records) == (1, records[1])
    assert root_cause([(0, 1), (1, -9)], {0: records[0]})[0] == 1  # a silent death (SIGKILL) first


def test_a_rank_that_finished_is_not_blamed_for_a_peer_stuck_after_it():
    records = {0: record(0, 6, hang.DONE), 1: record(1, 6, hang.CHECKPOINT)}
    verdict = hang.diagnose(records, {}, now=200.0)
    assert verdict.culprits == [1] and verdict.waiting == [0]
