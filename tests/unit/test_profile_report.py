"""``hpc-train-report RUN_DIR --profile`` (hpc_train.report.profile_report) on small traces built here in the shape
torch.profiler's ``export_chrome_trace`` writes (gzip'd Chrome trace JSON; the events' fields and categories as in
a real two-rank gloo DDP trace): self time, the step breakdown, the slowest rank, and what a bad input gets.
No torch, no process."""

from __future__ import annotations

import ast
import gzip
import json
from pathlib import Path
from typing import Any, Dict, List

import pytest

from hpc_train.report import command, profile_report
from hpc_train.report.profile_report import TraceError, read_trace, render, summarise

ROOT = Path(__file__).resolve().parents[2]
PID, MAIN, GLOO = 4653, 4653, 4669  # the rank's process, its main thread, gloo's worker thread
STEP_US = 10_000.0
REPORT = "hpc_train.report.profile_report"


def _x(cat: str, name: str, ts: float, dur: float, pid: Any = PID, tid: Any = MAIN, **args: Any) -> Dict[str, Any]:
    """One complete event as torch writes it (its args trimmed to the ones every event has)."""
    return {
        "ph": "X",
        "cat": cat,
        "name": name,
        "pid": pid,
        "tid": tid,
        "ts": ts,
        "dur": dur,
        "args": {"External id": int(ts), "Record function id": 0, "Ev Idx": int(ts), **args},
    }


def _step(number: int, start: float, slow: bool) -> List[Dict[str, Any]]:
    """One DDP step on a CPU: 1 ms waiting for the batch (a sleep: no op), forward and backward with the gradient
    all-reduce handed to gloo's thread, then the optimizer. The slow rank computes 5.8 ms more and so reaches the
    all-reduce last; the fast one waits for it there, on gloo's thread, while its main thread runs no op."""
    o = start
    events = [
        _x("user_annotation", f"hpc_train.step#{number}", o, STEP_US),
        _x("user_annotation", "hpc_train.data", o, 1000),
        _x("python_function", "<built-in function sleep>", o + 10, 980),
        _x("user_annotation", "hpc_train.forward_backward", o + 1000, 8000),
        _x("cpu_op", "aten::linear", o + 1000, 2000, **{"Input Dims": [[64, 256], [512, 256], [512]]}),
        _x("cpu_op", "aten::addmm", o + 1100, 1500),  # nested in aten::linear: its time is not linear's self time
        _x("user_annotation", "hpc_train.optimizer", o + 9000, 800),
        _x("cpu_op", "aten::add_", o + 9000, 500),
    ]
    reduce_at = o + 8800 if slow else o + 3000
    events += [
        _x("python_function", "<built-in method run_backward>", o + 3000, 6000),  # the wait: no op holds it
        _x("cpu_op", "c10d::allreduce_", reduce_at, 100),
        _x("cpu_op", "record_param_comms", reduce_at + 10, 50),  # nested in the collective: counted once
        _x("user_annotation", "gloo:all_reduce", reduce_at + 100, o + 9000 - reduce_at - 100, tid=GLOO),
    ]
    if slow:
        events.append(_x("cpu_op", "aten::mm", o + 3000, 5800))
    return events


def _write(run_dir: Path, rank: int, events: List[Dict[str, Any]], world: int = 2, steps: str = "3-4") -> Path:
    meta = [
        {"ph": "M", "name": "process_name", "ts": 0, "pid": PID, "tid": 0, "args": {"name": "python"}},
        {"ph": "M", "name": "thread_name", "ts": 0, "pid": PID, "tid": GLOO, "args": {"name": "pt_gloo_runloop"}},
    ]
    span = {"ph": "X", "cat": "Trace", "name": "PyTorch Profiler (0)", "pid": "Spans", "tid": "PyTorch Profiler"}
    trace = {
        "schemaVersion": 1,
        "deviceProperties": [],
        "distributedInfo": {"backend": "gloo", "rank": rank, "world_size": world},
        "record_shapes": 1,
        "with_stack": 1,
        "displayTimeUnit": "ms",
        "baseTimeNanoseconds": 1790857026000000000,
        "traceEvents": [*meta, *events, {**span, "ts": 0, "dur": 30_000, "args": {"Op count": 0}}],
        "traceName": "/tmp/trace.json",
    }
    path = run_dir / "profile" / f"rank{rank}.steps{steps}.trace.json.gz"
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt", encoding="utf-8") as out:
        json.dump(trace, out)
    return path


def _cpu_rank(run_dir: Path, rank: int, slow: bool) -> Path:
    before = [_x("cpu_op", "aten::zeros", 100, 800)]  # before the profiled steps: not counted
    return _write(run_dir, rank, before + _step(3, 1000, slow) + _step(4, 1000 + STEP_US, slow))


def _two_ranks(tmp_path: Path) -> Path:
    _cpu_rank(tmp_path, 0, slow=False)
    _cpu_rank(tmp_path, 1, slow=True)
    return tmp_path


def test_the_top_operator_is_ranked_by_self_time_a_nested_ops_time_not_its_parents(tmp_path):
    fast = summarise(_two_ranks(tmp_path)).ranks[0]
    top = {row["name"]: row for row in fast["top_operators"]}
    assert fast["top_operators"][0]["name"] == "aten::addmm"  # linear lasts longer, but addmm's 1.5 ms is inside it
    assert top["aten::addmm"]["self_ms"] == pytest.approx(3.0) and top["aten::addmm"]["calls"] == 2
    assert top["aten::linear"]["self_ms"] == pytest.approx(1.0)
    assert top["c10d::allreduce_"]["self_ms"] == pytest.approx(0.1)  # 2 x (100 - the nested 50 us)
    assert "aten::zeros" not in top  # before the first step
    total = 2 * (500 + 1500 + 500 + 50 + 50)
    assert top["aten::addmm"]["share"] == pytest.approx(3000 / total)
    slow = summarise(tmp_path).ranks[1]["top_operators"][0]
    assert (slow["name"], slow["calls"], slow["self_ms"]) == ("aten::mm", 2, pytest.approx(11.6))


def test_the_breakdown_of_a_step_matches_the_hand_computed_one_and_adds_up(tmp_path):
    fast, slow = summarise(_two_ranks(tmp_path)).ranks
    # fast: 1 ms data, 2 ms linear + 0.5 ms add_, 0.1 ms allreduce_ then 5.9 ms gloo waiting for the slow rank
    expected = {"compute": 2.5, "communication": 6.0, "data": 1.0, "checkpoint": 0.0, "idle": 0.5}
    assert fast["ms_per_step"] == pytest.approx(expected)
    assert fast["shares"] == pytest.approx({name: ms / 10.0 for name, ms in expected.items()})
    assert slow["ms_per_step"] == pytest.approx(
        {"compute": 8.3, "communication": 0.2, "data": 1.0, "checkpoint": 0.0, "idle": 0.5}
    )
    for rank in (fast, slow):
        assert rank["step_ms"] == pytest.approx(10.0) and rank["steps_profiled"] == 2
        assert abs(sum(rank["shares"].values()) - 1.0) < 1e-9


def test_the_rank_with_the_most_work_is_named_slowest(tmp_path):
    found = summarise(_two_ranks(tmp_path))
    assert found.comparisons == [
        {"steps": [3, 4], "slowest": 1, "work_ms": pytest.approx(9.3), "median_ms": pytest.approx(3.5)}
    ]
    text = render(tmp_path)
    assert "slowest rank: 1 (9.3 ms of work per step against a median of 3.5 ms;" in text
    assert "rank 0, steps 3-4 (2 profiled, CPU): 10.0 ms per step" in text


def test_json_has_the_same_numbers(tmp_path, capsys):
    assert command.main([str(_two_ranks(tmp_path)), "--profile", "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["ranks"][1]["ms_per_step"]["compute"] == pytest.approx(8.3)
    assert printed["comparisons"][0]["slowest"] == 1 and printed["problems"] == []


def test_one_rank_profiled_says_a_comparison_needs_several(tmp_path):
    _cpu_rank(tmp_path, 0, slow=False)
    text = render(tmp_path)
    assert "only rank 0's trace of these steps" in text and "trainer.profile.ranks=all" in text
    assert "slowest rank:" not in text


def test_a_gpu_trace_is_measured_on_the_gpu_timeline(tmp_path):
    """Host steps of 10 ms; the GPU overlaps NCCL with a GEMM, runs a kernel while the host waits for a batch, and
    finishes the last step's work 1 ms after the host's annotation ends."""
    events = []
    for number, o in ((3, 1000.0), (4, 11000.0)):
        events += [
            _x("user_annotation", f"hpc_train.step#{number}", o, STEP_US),
            _x("user_annotation", "hpc_train.data", o, 2000),
            _x("gpu_user_annotation", f"hpc_train.step#{number}", o + 2500, 8000, pid=0, tid=7),
            _x("cuda_runtime", "cudaLaunchKernel", o + 2100, 5, correlation=number),
            _x("kernel", "ampere_sgemm_128x64_nn", o + 2500, 4000, pid=0, tid=7, stream=7, correlation=number),
            _x("kernel", "ncclDevKernel_AllReduce_Sum_f32_RING_LL", o + 5000, 3000, pid=0, tid=20, stream=20),
        ]
    events += [
        _x("kernel", "elementwise_kernel", 11500, 500, pid=0, tid=7),  # while the host waits for the batch
        _x("kernel", "multi_tensor_apply_kernel", 20500, 1500, pid=0, tid=7),  # after the host's last step
    ]
    _write(tmp_path, 0, events, world=1)
    (gpu,) = summarise(tmp_path).ranks
    assert gpu["device"] == "gpu" and gpu["step_ms"] == pytest.approx(10.5)  # 1000 .. 22000 us, 2 steps
    assert gpu["ms_per_step"] == pytest.approx(
        {"compute": 5.0, "communication": 1.5, "data": 1.75, "checkpoint": 0.0, "idle": 2.25}
    )
    assert gpu["top_kernels"][0]["name"] == "ampere_sgemm_128x64_nn"
    assert gpu["top_kernels"][0]["share"] == pytest.approx(8000 / 16000)
    assert "(this run has one)" in render(tmp_path)


def test_no_trace_names_how_to_take_one_exit_code_2(tmp_path, capsys):
    assert command.main([str(tmp_path), "--profile"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "trainer.profile.steps=[10,12]" in err and "trainer.profile.ranks=all" in err


def test_a_truncated_trace_is_one_line_not_a_traceback(tmp_path, capsys):
    _two_ranks(tmp_path)
    broken = tmp_path / "profile" / "rank1.steps3-4.trace.json.gz"
    broken.write_bytes(broken.read_bytes()[:200])
    with pytest.raises(TraceError, match=r"rank1\.steps3-4\.trace\.json\.gz: unreadable trace"):
        read_trace(broken)
    assert profile_report.main(tmp_path) == 2
    out = capsys.readouterr().out
    assert [line for line in out.splitlines() if "unreadable" in line] == [
        f"hpc-train-report: {broken}: unreadable trace (Compressed file ended before the end-of-stream marker was"
        " reached): did the rank stop while writing it?"
    ]
    assert "Traceback" not in out and "rank 0, steps 3-4" in out


def _imports(path: Path, anywhere: bool) -> List[str]:
    """The modules a file imports: at its top level, or (`anywhere`) in its functions too."""
    tree = ast.parse(path.read_text())
    found = []
    for node in ast.walk(tree) if anywhere else tree.body:
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.append(node.module)
    return found


def test_the_profile_report_imports_no_torch():
    """It runs on the login node: it imports no torch, not even in a function, and the hpc_train modules it imports
    (their packages' __init__ too) import none when imported."""
    seen, todo = {REPORT}, [REPORT]
    while todo:
        module = todo.pop()
        path = ROOT / (module.replace(".", "/") + ".py")
        imported = _imports(path if path.exists() else path.with_suffix("") / "__init__.py", module == REPORT)
        assert not [name for name in imported if name.split(".")[0] == "torch"], module
        parents = [".".join(module.split(".")[:n]) for n in range(1, module.count(".") + 1)]
        new = {name for name in imported + parents if name.split(".")[0] == "hpc_train"} - seen
        seen |= new
        todo += sorted(new)
    assert {"hpc_train.records.profile_traces", "hpc_train.jobs.text_table", "hpc_train"} <= seen
