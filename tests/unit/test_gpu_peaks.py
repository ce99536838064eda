"""The table of dense GPU peaks (hpc_train.contracts.gpu_peaks): each device found by the name torch gives it, the
most specific row first; every figure a positive dense peak of a known precision with its source; no torch."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from hpc_train.config.cluster import PEAK_PRECISIONS
from hpc_train.contracts import gpu_peaks


@pytest.mark.parametrize(
    "name, row",
    [
        ("NVIDIA H100 80GB HBM3", "H100 SXM"),
        ("NVIDIA H100 PCIe", "H100 PCIe"),
        ("NVIDIA H100 NVL", "H100 NVL"),
        ("NVIDIA H200", "H200 SXM"),
        ("NVIDIA H200 NVL", "H200 NVL"),
        ("NVIDIA GH200 480GB", "GH200"),
        ("NVIDIA A100-SXM4-80GB", "A100"),
        ("NVIDIA A100-SXM4-40GB", "A100"),
        ("NVIDIA A100 80GB PCIe", "A100"),
        ("NVIDIA A100-PCIE-40GB", "A100"),
        ("Tesla V100-SXM2-32GB", "V100 SXM2"),
        ("Tesla V100-SXM2-16GB", "V100 SXM2"),
        ("Tesla V100-PCIE-16GB", "V100 PCIe"),
        ("Tesla V100-PCIE-32GB", "V100 PCIe"),
        ("Tesla V100S-PCIE-32GB", "V100S PCIe"),
        ("NVIDIA B200", "B200"),
        ("NVIDIA L40S", "L40S"),
        ("AMD Instinct MI250X", "MI250X (one GCD)"),
        ("AMD Instinct MI250X/MI250", "MI250X (one GCD)"),
        ("AMD Instinct MI250", "MI250 (one GCD)"),
        ("AMD Instinct MI300X", "MI300X"),
        ("nvidia h100 pcie", "H100 PCIe"),  # case does not matter
    ],
)
def test_each_gpu_is_found_by_the_name_torch_gives_it(name, row):
    found = gpu_peaks.peak_for(name)
    assert found is not None and found.device == row, f"{name!r}: {found}"


@pytest.mark.parametrize("name", ["NVIDIA GeForce RTX 3090", "cpu", "", "NVIDIA L40", "AMD Instinct MI100"])
def test_a_device_the_table_does_not_know_has_no_row(name):
    assert gpu_peaks.peak_for(name) is None


def test_the_sxm_and_pcie_h100_are_told_apart():
    sxm, pcie = gpu_peaks.peak_for("NVIDIA H100 80GB HBM3"), gpu_peaks.peak_for("NVIDIA H100 PCIe")
    assert sxm.tflops["bf16"] == 989.4 and sxm.tflops["tf32"] == 494.7 and sxm.tflops["fp32"] == 66.9
    assert pcie.tflops["bf16"] == 756.5


def test_the_dense_figures_not_the_sparse_ones():
    assert gpu_peaks.peak_for("NVIDIA A100-SXM4-80GB").tflops == {
        "bf16": 312.0,
        "fp16": 312.0,
        "tf32": 156.0,
        "fp32": 19.5,
    }
    assert gpu_peaks.peak_for("NVIDIA B200").tflops["bf16"] == 2250.0
    mi250x = gpu_peaks.peak_for("AMD Instinct MI250X").tflops  # one GCD: half the card's 383 and 95.7
    assert mi250x["bf16"] == pytest.approx(383 / 2) and mi250x["fp32"] == pytest.approx(95.7 / 2)


def test_every_row_gives_positive_peaks_of_known_precisions_and_a_source():
    assert gpu_peaks.PRECISIONS == PEAK_PRECISIONS == ("bf16", "fp16", "tf32", "fp32")
    for pattern, row in gpu_peaks.TABLE:
        assert row.device and row.source, pattern
        assert row.tflops and set(row.tflops) <= set(PEAK_PRECISIONS), f"{row.device}: {set(row.tflops)}"
        assert all(isinstance(v, float) and v > 0 for v in row.tflops.values()), row.device
        if "tf32" in row.tflops and "bf16" in row.tflops:  # tensor-core tf32 runs at half the bf16 rate
            assert row.tflops["tf32"] == pytest.approx(row.tflops["bf16"] / 2, rel=0.03), row.device
        assert row.tflops.get("fp16", 0) >= row.tflops["fp32"], row.device


def test_a_row_is_found_by_its_own_pattern_not_an_earlier_one():
    """The most specific pattern first: each row's own name leads to it (no earlier pattern swallows it)."""
    for pattern, row in gpu_peaks.TABLE:
        assert gpu_peaks.peak_for(pattern.replace(".*", " ")) is row, pattern


def test_precision_peak_is_the_value_or_none():
    v100 = gpu_peaks.peak_for("Tesla V100-SXM2-32GB").tflops
    assert gpu_peaks.precision_peak(v100, "fp16") == 125.0 and gpu_peaks.precision_peak(v100, "bf16") is None
    assert gpu_peaks.precision_peak(gpu_peaks.peak_for("AMD Instinct MI250X").tflops, "tf32") is None
    assert gpu_peaks.precision_peak({"bf16": 989}, "bf16") == 989.0


def test_the_rows_cannot_be_changed_in_place():
    with pytest.raises(TypeError):
        gpu_peaks.peak_for("NVIDIA H100 PCIe").tflops["bf16"] = 1.0  # type: ignore[index]


def test_the_table_imports_no_torch():
    """Read on the login side, where torch may be absent: its imports (and theirs, within hpc_train) hold no torch."""
    tree = ast.parse(Path(gpu_peaks.__file__).read_text())
    imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    imported |= {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module}
    assert not any(name.split(".")[0] == "torch" for name in imported), imported
    assert {name for name in imported if name.startswith("hpc_train")} == {"hpc_train.config.cluster"}
