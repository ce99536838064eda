"""The performance figures' parts that start no process: the closing line's wording, the peak a precision is held
against, the step clock's windows, the FLOP counter on a written-down model, the out-of-memory message."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
import torch.nn as nn

from hpc_train.compute.performance import memory, peaks, step_clock
from hpc_train.compute.performance.flops import StepFlops
from hpc_train.compute.performance.step_clock import StepClock
from hpc_train.records import performance


def test_a_run_is_named_input_bound_from_a_quarter_of_its_step_waiting_for_data():
    def summary(data):
        return {"step_breakdown": {"data": data, "forward_backward": 1 - data}}

    assert performance.input_bound_note(summary(performance.INPUT_BOUND_SHARE - 0.01), 0) is None
    assert performance.input_bound_note(summary(0.62), 4) == (
        "waiting for data 62 % of each step: raise data.num_workers (now 4)"
    )
    assert performance.input_bound_note({}, 0) is None  # a summary written before the breakdown existed


def test_mfu_is_said_against_its_peak_and_is_never_made_up_without_one():
    with_peak = {"tflops_per_device": 128.0, "mfu": 0.41, "peak_tflops": 312.0}
    assert performance.mfu_text(with_peak) == "MFU 41.0 % (128 TFLOP/s per device of 312 peak)"
    cpu = {"tflops_per_device": 0.0002, "mfu": None, "device_name": "cpu"}
    assert performance.mfu_text(cpu) == "0.2 GFLOP/s per device (MFU n/a: no known peak for cpu)"
    assert performance.mfu_text({}) is None


def test_each_precision_is_held_against_its_own_column_and_fp32_against_tf32_when_torch_allows_it():
    assert peaks.column("bf16") == "bf16" and peaks.column("16") == "fp16"
    before = torch.get_float32_matmul_precision()
    try:
        torch.set_float32_matmul_precision("highest")
        assert peaks.column("32") == "fp32"
        torch.set_float32_matmul_precision("high")
        assert peaks.column("32") == "tf32"
    finally:
        torch.set_float32_matmul_precision(before)
    cpu = peaks.device_peak(torch.device("cpu"), "bf16", {"bf16": 989.0})
    assert cpu.tflops is None and cpu.source is None  # no GPU: no peak, even with an override


def test_the_flop_counter_counts_a_linear_stack_as_written_down():
    """Linear(i -> o) on b rows: 2*b*i*o forward, as much for the weight's gradient, and for the input's gradient
    only where the input needs one (not the first layer's: its input is data)."""
    b, sizes = 8, (12, 16, 4)
    model = nn.Sequential(nn.Linear(sizes[0], sizes[1]), nn.ReLU(), nn.Linear(sizes[1], sizes[2]))
    flops = StepFlops()
    for step in range(3):  # the second step of an attempt is counted (the first sets things up); once
        assert flops.due == (step == 1)
        with flops.counting():
            model(torch.randn(b, sizes[0])).sum().backward()
        assert (flops.per_step is None) == (step == 0)
    first, second = 2 * b * sizes[0] * sizes[1], 2 * b * sizes[1] * sizes[2]
    assert flops.per_step == 2 * first + 3 * second


def test_the_clock_leaves_excluded_time_out_of_the_step_and_splits_it_into_phases(monkeypatch):
    """The clock's arithmetic on a clock the test advances (no wall-clock bound on a loaded machine): each step is
    0.25 s of data, 0.5 s of compute and 0.125 s untimed, then 10 s excluded (binary fractions: sums exact)."""
    now = [0.0]
    monkeypatch.setattr(step_clock, "time", SimpleNamespace(perf_counter=lambda: now[0]))
    clock = StepClock(torch.device("cpu"), first_timed_step=2)
    for step in (1, 2, 3):
        clock.step_boundary(step)
        with clock.phase("data"):
            now[0] += 0.25
        with clock.phase("forward_backward"):
            now[0] += 0.5
        now[0] += 0.125  # in the step, in no phase
        with clock.excluded():
            now[0] += 10.0  # an evaluation: not part of the step
    clock.finish()
    window = clock.take_window()
    assert window.steps == 3 and window.wall == 3 * 0.875  # the excluded 30 s are left out
    assert window.phases["data"] == 3 * 0.25 and window.phases["forward_backward"] == 3 * 0.5
    assert (clock.run.steps, clock.run.wall) == (2, 2 * 0.875)  # step 1 is the warm-up
    assert clock.take_window().steps == 0  # a new window after each


def test_an_out_of_memory_error_becomes_a_refusal_saying_what_lowers_the_memory():
    with pytest.raises(memory.OutOfMemory) as caught:
        with memory.out_of_memory_named(3, 17, torch.device("cpu")):
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 1.00 GiB")
    said = str(caught.value)
    assert said.startswith("rank 3 ran out of memory on cpu in step 17 (peak so far ")
    assert "Tried to allocate 1.00 GiB" in said
    assert all(key in said for key in ("trainer.batch_size", "grad_accum_steps", "activation_checkpointing"))
