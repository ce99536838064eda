"""Where the time and memory go, on real runs (gloo ranks on the CPU): the FLOPs of a step against a hand count, the
summary's throughput, memory and step breakdown, an input-bound run named in its closing line, the peak memory of a
rank that holds a known tensor, an out-of-memory error in words, and profiler traces of chosen steps and ranks read
back by hpc-train-report --profile."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.cli import TINY, assert_ok, read_summary, run_cli
from tests.support.paths import REPO
from tests.support.perf_parts import HELD_MB

IMAGE, HIDDEN, CLASSES = 8, 64, 10  # toy_mlp on TINY's data: Linear(3*8*8 -> 64), ReLU, Linear(64 -> 10)
BATCH = 32
QUICK = [*TINY, "trainer.eval=false", f"trainer.batch_size={BATCH}", "trainer.checkpoint_every=0"]


def hand_count(batch: int) -> int:
    """The FLOPs of one step of toy_mlp over `batch` samples, written down: a Linear(i -> o) on b rows is a matrix
    product of 2*b*i*o FLOPs forward, the same again for its weight's gradient, and again for its input's gradient
    when that input needs one. The first layer's input (the images) needs none, so that product is not computed (nor
    counted). Bias additions, ReLU, the loss and the optimizer are element-wise work the counter leaves out."""
    first, second = 2 * batch * 3 * IMAGE * IMAGE * HIDDEN, 2 * batch * HIDDEN * CLASSES
    return (first + first) + (second + second + second)


def train_rows(run_dir: Path):
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [row for row in rows if row["kind"] == "train"]


@pytest.fixture(scope="module")
def profiled(tmp_path_factory) -> Path:
    """2-rank ddp, 2 micro-batches per step, rank 1 slow to read its data; steps 3-4 profiled on both ranks."""
    run_dir = tmp_path_factory.mktemp("profiled")
    slow_data = "data.train={_target_:tests.support.perf_parts.SlowReads,sleep_s:0.01,only_rank:1}"
    args = [*QUICK, "strategy=ddp", "trainer.max_steps=6", "trainer.log_every=2", "trainer.grad_accum_steps=2"]
    args.append("trainer.throughput_warmup_steps=1")
    proc = run_cli([*args, slow_data, "trainer.profile.steps=[3,4]", "trainer.profile.ranks=all"], run_dir)
    assert_ok(proc)
    (run_dir / "stdout.txt").write_text(proc.stdout + proc.stderr)
    return run_dir


def test_the_flops_of_a_step_equal_the_hand_count_over_every_rank_and_micro_batch(profiled):
    summary = read_summary(profiled)
    assert summary["flops_per_step"] == hand_count(BATCH)  # 2 ranks x 2 micro-batches of 8: the global batch's
    assert summary["tflops_per_device"] == pytest.approx(
        hand_count(BATCH) / 2 / summary["step_time_s"] / 1e12, rel=1e-9
    )
    assert summary["step_time_s"] == pytest.approx(BATCH / summary["samples_per_sec"], rel=1e-9)
    assert summary["mfu"] is None and summary["peak_tflops"] is None  # a CPU has no peak to hold it against
    assert "MFU n/a" in (profiled / "stdout.txt").read_text()


def test_the_summary_and_the_train_rows_carry_memory_and_the_step_breakdown_per_rank(profiled):
    summary = read_summary(profiled)
    per_rank = summary["step_breakdown_per_rank"]
    assert len(per_rank) == 2
    for shares in [summary["step_breakdown"], *per_rank]:
        assert set(shares) == {"data", "forward_backward", "optimizer", "checkpoint", "other"}
        assert sum(shares.values()) == pytest.approx(1.0, abs=1e-6)
    assert per_rank[1]["data"] > per_rank[0]["data"]  # rank 1 reads slowly: 16 reads x 10 ms per step
    memory = summary["peak_memory_per_rank"]
    assert [row["rank"] for row in memory] == [0, 1] and all(row["resident"] > 50 * 2**20 for row in memory)
    largest = summary["peak_memory_rank"]
    assert summary["peak_memory_bytes"] == memory[largest]["resident"] == max(row["resident"] for row in memory)
    rows = train_rows(profiled)
    assert [row["step"] for row in rows] == [2, 4, 6]
    for row in rows:
        assert row["samples_per_sec"] > 0 and row["step_time_s"] > 0 and row["peak_memory_bytes"] > 0
        assert sum(row[f"{phase}_share"] for phase in summary["step_breakdown"]) == pytest.approx(1.0, abs=1e-6)
        assert row["flops_per_step"] == hand_count(BATCH)


def test_a_profile_of_steps_3_to_4_writes_one_chrome_trace_per_chosen_rank_with_both_steps(profiled):
    traces = sorted((profiled / "profile").glob("*.trace.json.gz"))
    assert [path.name for path in traces] == ["rank0.steps3-4.trace.json.gz", "rank1.steps3-4.trace.json.gz"]
    for path in traces:
        events = json.loads(gzip.decompress(path.read_bytes()))["traceEvents"]
        steps = {event["name"] for event in events if event.get("name", "").startswith("hpc_train.step#")}
        assert steps == {"hpc_train.step#3", "hpc_train.step#4"}
        names = {event.get("name") for event in events}
        assert {"hpc_train.data", "hpc_train.forward_backward", "hpc_train.optimizer"} <= names
        assert any(event.get("args", {}).get("Input Dims") for event in events)  # shapes recorded
    assert str(traces[0]) in (profiled / "stdout.txt").read_text()  # rank 0 names where the traces are


def test_the_profilers_own_lines_go_to_each_ranks_log_not_the_terminal(profiled):
    printed = (profiled / "stdout.txt").read_text()
    assert "profiler_start" not in printed and "USDT" not in printed, printed
    for rank in (0, 1):  # kineto writes them from C++ to the process's stderr: kept, in the rank's own log
        log = (profiled / "logs" / f"rank{rank}.log").read_text()
        assert "profiler_start" in log and "profiler_stop" in log, log


def test_the_report_reads_the_traces_without_torch_and_names_the_slow_rank(profiled):
    code = (
        "import sys; from hpc_train.report.command import main; code = main([sys.argv[1], '--profile']);"
        " assert 'torch' not in sys.modules, 'the report imported torch'; sys.exit(code)"
    )
    proc = subprocess.run([sys.executable, "-c", code, str(profiled)], capture_output=True, text=True, cwd=REPO)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "slowest rank: 1" in proc.stdout


def test_a_run_waiting_on_its_data_says_so_in_its_closing_line(tmp_path):
    """One intra-op thread: with two (the launcher's share of a 2-core machine) on a machine the other tests keep
    busy, each op of the tiny MLP waits at an OpenMP barrier for a descheduled thread, and forward-backward took up to
    half of a step (measured: data 0.43 and 0.51 under load, 0.99 with one thread under the same load)."""
    slow_data = "data.train={_target_:tests.support.perf_parts.SlowReads,sleep_s:0.004}"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = run_cli([*QUICK, "strategy=single", "trainer.max_steps=4", slow_data], tmp_path / "run", env=env)
    assert_ok(proc)
    share = read_summary(tmp_path / "run")["step_breakdown"]["data"]
    assert share > 0.5  # 32 reads of 4 ms against a step of a tiny MLP
    done = next(line for line in proc.stdout.splitlines() if line.startswith("hpc-train: done:"))
    assert done.endswith(f"waiting for data {share * 100:.0f} % of each step: raise data.num_workers (now 0)")


def test_a_rank_holding_a_known_tensor_shows_at_least_that_much_more_peak_memory(tmp_path):
    """The same run with and without a 256 MB tensor held by the data set from its construction (before the model,
    the first step and every later allocation) to the end: the resident high-water mark grows by at least that, less
    1 MiB. The mark covers the whole process: a start-up transient freed before the data set is built (tens of KB,
    measured) can be the plain run's peak, and the tensor never adds to it."""
    peaks = {}
    for held in (0, HELD_MB):
        data = f"data.train={{_target_:tests.support.perf_parts.SlowReads,sleep_s:0,hold_mb:{held}}}"
        assert_ok(run_cli([*QUICK, "strategy=single", "trainer.max_steps=3", data], tmp_path / str(held)))
        peaks[held] = read_summary(tmp_path / str(held))["peak_memory_bytes"]
    assert peaks[HELD_MB] - peaks[0] >= HELD_MB * 2**20 - 2**20


def test_an_out_of_memory_error_names_the_rank_the_step_the_peak_and_what_lowers_it(tmp_path):
    env = {**os.environ, "HPC_TRAIN_OOM_AT": "0:1"}
    proc = run_cli([*QUICK, "strategy=single", "trainer.max_steps=4"], tmp_path / "run", env=env)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    said = proc.stdout + proc.stderr
    assert "rank 0 ran out of memory on cpu in step 2 (peak so far" in said
    for key in ("trainer.batch_size", "trainer.grad_accum_steps", "trainer.activation_checkpointing=blocks"):
        assert key in said
    assert "strategy=fsdp" in said and "Traceback" not in said
