"""The memory check before queueing (hpc_train.launch.planning.memory_check), where it needs no estimate: the GPU's
memory from the table or the key, the refusals that name the key to set, and a check that is off (or auto without a
known memory) starting no process."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import List

import pytest
from hydra import compose, initialize_config_dir

from hpc_train.conf import CONFIG_DIR
from hpc_train.config.errors import ConfigError
from hpc_train.contracts.gpu_memory import GIB, TYPES, UnknownMemory, device_bytes, gpu_memory, tensor_budget
from hpc_train.launch.planning import fit_run, memory_check
from hpc_train.launch.planning.jobspec import build_job_spec
from hpc_train.launch.planning.plan import make_plan


def planned(overrides: List[str], tmp_path: Path):
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        cfg = compose(config_name="config", overrides=["launcher=slurm", "cluster=slurm", *overrides])
    plan = make_plan(cfg, tmp_path / "run")
    return plan, build_job_spec(plan, choices={})


def test_the_table_gives_a_types_usable_memory_and_refuses_a_type_sold_in_several_sizes_without_one():
    assert gpu_memory("h100", None).usable_gib == pytest.approx(79.1, abs=0.01)
    assert gpu_memory("A100", 40).usable_gib == pytest.approx(39.39, abs=0.01)
    assert gpu_memory(None, None) is None
    declared = gpu_memory(None, 80)  # a declared size of no known type: less the largest share a driver keeps
    assert 73 < declared.usable_gib < 80 and "cluster.gpu_memory_gb" in declared.source
    with pytest.raises(UnknownMemory, match="40 GB or 80 GB"):
        gpu_memory("a100", None)
    with pytest.raises(UnknownMemory, match="does not know cluster.gpu_type=tpu9"):
        gpu_memory("tpu9", None)
    assert all(size.source for row in TYPES.values() for size in row.sizes)
    one_rank, eight = device_bytes(gpu_memory("h100", None), 10 * GIB, 0), device_bytes(gpu_memory("h100", None), 0, 1)
    assert one_rank == int(0.5 * GIB + GIB) and eight == int(1.5 * GIB)  # context + slack; context + NCCL


def test_a_gpu_type_of_unknown_memory_is_refused_naming_the_key_to_set(tmp_path):
    plan, spec = planned(["+cluster.gpu_type=v100"], tmp_path)
    with pytest.raises(ConfigError) as refused:
        memory_check.check(plan, spec)
    assert refused.value.key == "cluster.gpu_memory_gb" and "16 GB or 32 GB" in refused.value.problem
    plan, spec = planned(["resources.memory_check=always"], tmp_path)
    with pytest.raises(ConfigError, match="cluster.gpu_memory_gb=N"):
        memory_check.check(plan, spec)


def test_a_check_that_is_off_or_has_no_memory_to_compare_with_starts_no_process(tmp_path, monkeypatch):
    def no_process(*args, **kwargs):
        raise AssertionError(f"a process was started: {args}")

    monkeypatch.setattr(subprocess, "run", no_process)
    for overrides in (["resources.memory_check=never", "cluster.gpu_memory_gb=80"], ["resources.memory_check=auto"]):
        plan, spec = planned(overrides, tmp_path)
        assert memory_check.check(plan, spec) is None
    (tmp_path / "train.py").write_text("")
    monkeypatch.chdir(tmp_path)
    plan, spec = planned(
        ["resources.memory_check=always", "cluster.gpu_memory_gb=80", "script.argv=[train.py]"], tmp_path
    )
    with pytest.raises(ConfigError, match="script's own"):
        memory_check.check(plan, spec)


def test_a_sweep_over_what_holds_no_tensor_estimates_once():
    spec = {
        "model": {"dim": 8},
        "data": {"seq_len": 4},
        "strategy": {"name": "fsdp"},
        "trainer": {"batch_size": 8, "lr": 0.1},
        "job": {"layout": {"world_size": 4}, "code_dirs": [], "run_dir": "/a"},
    }
    other = {**spec, "trainer": {**spec["trainer"], "lr": 0.2}, "job": {**spec["job"], "run_dir": "/b"}}
    larger = {**spec, "trainer": {**spec["trainer"], "batch_size": 16}}
    assert memory_check.memory_key(spec) == memory_check.memory_key(other) != memory_check.memory_key(larger)


def test_a_failed_estimate_is_named_by_its_error_line_not_the_tracebacks_last():
    """What `resources.memory_check=auto` prints when it skips a job whose estimate crashed: the error, not the tail
    of a module's printout that ends torch's rank-prefixed traceback."""
    stderr = [
        "[rank0]: Traceback (most recent call last):",
        '[rank0]:   File "fsdp_init.py", line 45, in _validate_module',
        "[rank0]: ValueError: fully_shard does not support containers that do not implement forward: ModuleList(",
        "[rank0]:   (0-1): 2 x TransformerBlock()",
        "[rank0]: )",
    ]
    failed = fit_run.EstimateFailed(["python", "-m", fit_run.ESTIMATE_MODULE], 1, "\n".join(stderr))
    assert failed.last_line.startswith("ValueError: fully_shard does not support containers")
    assert fit_run.EstimateFailed(["python"], 1, "killed").last_line == "killed"


@pytest.mark.parametrize("communicators", [0, 1, 3])
def test_the_tensor_budget_is_the_largest_peak_whose_need_fits(communicators):
    """What the estimate is told it may hold: the need (tensors plus the device's share) at the budget fits the
    usable memory, one byte more does not."""
    for memory in (gpu_memory("h100", None), gpu_memory(None, 16)):
        budget = tensor_budget(memory, communicators)
        assert budget > 0
        assert budget + device_bytes(memory, budget, communicators) <= memory.usable_bytes
        assert budget + 1 + device_bytes(memory, budget + 1, communicators) > memory.usable_bytes
