"""The performance keys on the login side: trainer.profile.* and cluster.gpu_peak_tflops checked before anything is
queued (each refusal names its key and the fix), a profiled rank the job does not have refused, a trainer option
without the profile node run with its keys' defaults, and a peak table given whole over a profile's. The table of GPU
peaks itself: test_gpu_peaks.py."""

from __future__ import annotations

from pathlib import Path
from typing import List

import pytest
from hydra import compose, initialize_config_dir

from hpc_train.conf import CONFIG_DIR
from hpc_train.config import engine
from hpc_train.config.engine import whole_mappings
from hpc_train.config.errors import ConfigError
from hpc_train.launch.planning.plan import RunPlan, make_plan

TINY = ["model=toy_mlp", "data=synthetic", "data.image_size=8", "data.num_samples=64", "trainer.progress=false"]


def plan(overrides: List[str], tmp_path: Path) -> RunPlan:
    """What hpc-train checks before anything runs or is queued, in-process (as the CLI passes the overrides)."""
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        cfg = compose(config_name="config", overrides=whole_mappings([*TINY, "strategy=ddp", *overrides]))
    return make_plan(cfg, tmp_path / "run")


@pytest.mark.parametrize(
    "overrides",
    [
        ["trainer.profile.steps=[3,4]"],
        ["trainer.profile.steps=[5,5]", "trainer.profile.ranks=[0,1]", "trainer.profile.memory=true"],
        ["trainer.profile.steps=[1,2]", "trainer.profile.ranks=all"],
        ["trainer.profile.steps=[1,2]", "trainer.profile.ranks=[1]"],
        [
            "trainer.profile.steps=[100000,100000]"
        ],  # beyond the run's last step: not refused (its length may not be known)
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
        ("cluster.gpu_peak_tflops={bf16:0}", "cluster.gpu_peak_tflops", "positive number of TFLOP/s"),
        ("cluster.gpu_peak_tflops={bf16:true}", "cluster.gpu_peak_tflops", "positive number of TFLOP/s"),
        ("cluster.gpu_peak_tflops={}", "cluster.gpu_peak_tflops", "mapping of precision to TFLOP/s"),
        ("trainer.profile.steps=[1,2,3]", "trainer.profile.steps", "must be [first, last]"),
        ("trainer.profile.steps=[1.5,2]", "trainer.profile.steps", "must be [first, last]"),
        ("trainer.profile.ranks=[-1]", "trainer.profile.ranks", "list of rank numbers"),
        ("trainer.profile.ranks=0", "trainer.profile.ranks", "list of rank numbers"),
        ("trainer.profile=0", "trainer.profile", "must be a mapping of steps, ranks, memory"),
        ("trainer.profile=null", "trainer.profile", "must be a mapping of steps, ranks, memory"),
        ("+trainer.profile.every=2", "trainer.profile", "has no key 'every'"),
    ],
)
def test_bad_values_are_refused_naming_the_key_and_the_fix(override, key, said, tmp_path):
    with pytest.raises(ConfigError) as err:
        plan([override], tmp_path)
    assert err.value.key == key and said in str(err.value) and "Fix:" in str(err.value)


@pytest.mark.parametrize("ranks", ["[2]", "[1,2]"])
def test_a_profiled_rank_the_job_does_not_have_is_refused_before_queueing(ranks, tmp_path):
    with pytest.raises(ConfigError) as err:
        plan(["resources.gpus_per_node=2", "trainer.profile.steps=[3,4]", f"trainer.profile.ranks={ranks}"], tmp_path)
    assert err.value.key == "trainer.profile.ranks"
    assert "names rank 2, but this job has 2 ranks (0 to 1)" in str(err.value)
    assert "trainer.profile.ranks=all" in str(err.value)


def test_a_trainer_option_without_the_profile_node_runs_with_its_keys_defaults(tmp_path):
    spec = plan(["~trainer.profile"], tmp_path).config.plain()
    assert spec["trainer"]["profile"] == {"steps": None, "ranks": [0], "memory": False}
    partial = {"trainer": {"batch_size": 8, "profile": {"steps": [2, 3]}}}
    engine.complete(partial)
    assert partial["trainer"]["profile"] == {"steps": [2, 3], "ranks": [0], "memory": False}


def test_a_profiles_peak_table_is_read_per_gpu_type_and_a_table_given_whole_merges_over_it(tmp_path):
    """A site profile gives the peaks as a mapping, or per GPU type by interpolation (as jean_zay picks its partition);
    one given whole on the command line is merged over a mapping (cluster.extra's way) and replaces an interpolation."""
    conf = tmp_path / "conf" / "cluster"
    conf.mkdir(parents=True)
    (conf / "site.yaml").write_text("defaults:\n  - local\n  - _self_\nname: site\ngpu_peak_tflops: {bf16: 312}\n")
    (conf / "typed.yaml").write_text(
        "defaults:\n  - local\n  - _self_\nname: typed\ngpu_type: a\n"
        "types:\n  a: {peaks: {bf16: 312, tf32: 156}}\n  h: {peaks: {bf16: 989.4}}\n"
        "gpu_peak_tflops: ${cluster.types.${cluster.gpu_type}.peaks}\n"
    )
    search = f"hydra.searchpath=[file://{tmp_path / 'conf'}]"

    def peaks(profile: str, *overrides: str) -> dict:
        spec = plan([search, f"cluster={profile}", *overrides], tmp_path).config.plain()
        return spec["cluster"]["gpu_peak_tflops"]

    assert peaks("site") == {"bf16": 312}
    assert peaks("site", "cluster.gpu_peak_tflops={fp32:19.5}") == {"bf16": 312, "fp32": 19.5}
    assert peaks("site", "cluster.gpu_peak_tflops=null") is None
    assert peaks("typed") == {"bf16": 312, "tf32": 156}
    assert peaks("typed", "cluster.gpu_type=h") == {"bf16": 989.4}
    assert peaks("typed", "cluster.gpu_peak_tflops={fp32:66.9}") == {"fp32": 66.9}
    with pytest.raises(ConfigError) as err:
        peaks("site", "cluster.gpu_peak_tflops={bf17:1}")
    assert err.value.key == "cluster.gpu_peak_tflops"


def test_a_profile_of_a_script_job_is_refused_naming_how_to_profile_the_script(tmp_path):
    (tmp_path / "train.py").write_text("print('training')\n")
    with pytest.raises(ConfigError) as err:
        plan([f"script.argv=[{tmp_path / 'train.py'}]", "trainer.profile.steps=[3,4]"], tmp_path)
    assert err.value.key == "trainer.profile.steps" and "HPC_TRAIN_RUN_DIR/profile" in str(err.value)
