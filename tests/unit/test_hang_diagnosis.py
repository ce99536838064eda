"""How the hang watchdog reads what it gathered: which ranks are blamed, what counts as waiting in a collective, py-spy
dumps shown as tracebacks, and the automatic timeout."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from hpc_train.compute.runtime import pyspy
from hpc_train.records import hang


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
    assert not hang.in_collective(hang.RankStacks(1, {1: importing})) and hang.in_collective(
        hang.RankStacks(1, {1: waiting})
    )
    records = {r: record(r, 0, hang.RUNNING) for r in (0, 1)}
    stacks = {0: hang.RankStacks(1, {1: waiting}), 1: hang.RankStacks(1, {1: importing})}
    verdict = hang.diagnose(records, stacks, now=200.0)
    assert verdict.culprits == [1] and verdict.waiting == [0]
    # both still starting: neither waits for the other (rank 0 was blamed alone, rank 1 called waiting)
    stacks = {0: hang.RankStacks(1, {1: elsewhere}), 1: hang.RankStacks(1, {1: importing})}
    assert hang.diagnose(records, stacks, now=200.0).culprits == [0, 1]


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
    message = hang.describe(hang.Verdict([1], [0], 30.0), records, {0: None, 1: stacks}, 6, tmp_path)
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


def test_the_rank_that_died_first_is_blamed_by_its_time_of_death_not_its_report(tmp_path):
    from hpc_train.records.rank_errors import note_time_of_death, read_records, root_cause, write_error_record

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
