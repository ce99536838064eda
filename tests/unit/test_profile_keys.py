"""The performance keys on the login side: trainer.profile.* and cluster.gpu_peak_tflops checked before anything is
queued (each refusal names its key and the fix), a profiled rank the job does not have refused, and the table of GPU
peaks chosen by the name torch gives a device."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import List

import pytest
from hydra import compose, initialize_config_dir

from hpc_train.conf import CONFIG_DIR
from hpc_train.config.cluster import PEAK_PRECISIONS
from hpc_train.config.errors import ConfigError
from hpc_train.contracts import gpu_peaks
from hpc_train.launch.planning.plan import RunPlan, make_plan

TINY = ["model=toy_mlp", "data=synthetic", "data.image_size=8", "data.num_samples=64", "trainer.progress=false"]


def plan(overrides: List[str], tmp_path: Path) -> RunPlan:
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        cfg = compose(config_name="config", overrides=[*TINY, "strategy=ddp", *overrides])
    return make_plan(cfg, tmp_path / "run")


@pytest.mark.parametrize(
    "overrides",
    [
        ["trainer.profile.steps=[3,4]"],
        ["trainer.profile.steps=[5,5]", "trainer.profile.ranks=[0,1]", "trainer.profile.memory=true"],
        ["trainer.profile.steps=[1,2]", "trainer.profile.ranks=all"],
        ["trainer.profile.ranks=[7]"],  # no steps: no profile, so no rank to check
        ["cluster.gpu_peak_tflops={bf16:989.4,tf32:494.7}"],
    ],
    ids=str,
)
def test_good_values_plan(overrides, tmp_path):
    spec = plan(["resources.gpus_per_node=2", *overrides], tmp_path).config.plain()
    assert set(spec["trainer"]["profile"]) == {"steps", "ranks", "memory"}


@pytest.mark.parametrize(
    "override, key, said",
    [
        ("trainer.profile.steps=[4,3]", "trainer.profile.steps", "first step before the last"),
        ("trainer.profile.steps=[0,3]", "trainer.profile.steps", "two step numbers from 1"),
        ("trainer.profile.steps=5", "trainer.profile.steps", "must be [first, last]"),
        ("trainer.profile.ranks=[]", "trainer.profile.ranks", "non-empty list of rank numbers"),
        ("trainer.profile.ranks=some", "trainer.profile.ranks", "or all"),
        ("trainer.profile.memory=maybe", "trainer.profile.memory", "maybe"),
        ("cluster.gpu_peak_tflops={bf17:1}", "cluster.gpu_peak_tflops", "not one of the precisions"),
        ("cluster.gpu_peak_tflops={bf16:-1}", "cluster.gpu_peak_tflops", "positive number of TFLOP/s"),
        ("cluster.gpu_peak_tflops=989", "cluster.gpu_peak_tflops", "mapping of precision to TFLOP/s"),
    ],
)
def test_bad_values_are_refused_naming_the_key_and_the_fix(override, key, said, tmp_path):
    with pytest.raises(ConfigError) as err:
        plan([override], tmp_path)
    assert err.value.key == key and said in str(err.value) and "Fix:" in str(err.value)


def test_a_profiled_rank_the_job_does_not_have_is_refused_before_queueing(tmp_path):
    with pytest.raises(ConfigError) as err:
        plan(["resources.gpus_per_node=2", "trainer.profile.steps=[3,4]", "trainer.profile.ranks=[1,2]"], tmp_path)
    assert err.value.key == "trainer.profile.ranks"
    assert "names rank 2, but this job has 2 ranks (0 to 1)" in str(err.value)


@pytest.mark.parametrize(
    "name, row",
    [
        ("NVIDIA H100 80GB HBM3", "H100 SXM"),
        ("NVIDIA H100 PCIe", "H100 PCIe"),
        ("NVIDIA H100 NVL", "H100 NVL"),
        ("NVIDIA H200", "H200 SXM"),
        ("NVIDIA GH200 480GB", "GH200"),
        ("NVIDIA A100-SXM4-80GB", "A100"),
        ("NVIDIA A100 80GB PCIe", "A100"),
        ("Tesla V100-SXM2-32GB", "V100 SXM2"),
        ("Tesla V100-PCIE-16GB", "V100 PCIe"),
        ("NVIDIA B200", "B200"),
        ("NVIDIA L40S", "L40S"),
        ("AMD Instinct MI250X/MI250", "MI250X (one GCD)"),
        ("AMD Instinct MI300X", "MI300X"),
    ],
)
def test_each_gpu_is_found_by_the_name_torch_gives_it(name, row):
    found = gpu_peaks.peak_for(name)
    assert found is not None and found.device == row


def test_the_table_knows_the_sxm_and_pcie_h100_apart_and_no_other_device():
    assert gpu_peaks.peak_for("NVIDIA H100 80GB HBM3").tflops["bf16"] == 989.4
    assert gpu_peaks.peak_for("NVIDIA H100 PCIe").tflops["bf16"] == 756.5
    for unknown in ("NVIDIA GeForce RTX 3090", "cpu", ""):
        assert gpu_peaks.peak_for(unknown) is None


def test_every_row_gives_dense_positive_peaks_of_known_precisions_and_a_source():
    for _, row in gpu_peaks.TABLE:
        assert row.source and row.tflops and set(row.tflops) <= set(PEAK_PRECISIONS)
        assert all(value > 0 for value in row.tflops.values())
        if "tf32" in row.tflops and "bf16" in row.tflops:  # tensor-core tf32 runs at half the bf16 rate
            assert row.tflops["tf32"] == pytest.approx(row.tflops["bf16"] / 2, rel=0.03)
    assert gpu_peaks.precision_peak(gpu_peaks.peak_for("Tesla V100-SXM2-32GB").tflops, "bf16") is None


def test_the_table_imports_no_torch():
    tree = ast.parse(Path(gpu_peaks.__file__).read_text())
    imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    imported |= {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module}
    assert not any(name.split(".")[0] == "torch" for name in imported)


def test_a_profile_of_a_script_job_is_refused_naming_how_to_profile_the_script(tmp_path):
    (tmp_path / "train.py").write_text("print('training')\n")
    with pytest.raises(ConfigError) as err:
        plan([f"script.argv=[{tmp_path / 'train.py'}]", "trainer.profile.steps=[3,4]"], tmp_path)
    assert err.value.key == "trainer.profile.steps" and "HPC_TRAIN_RUN_DIR/profile" in str(err.value)
