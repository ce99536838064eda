"""resources.nodes=MIN-MAX: the spelling, the strategies that may have a range, the script Slurm gets, the checks at
every count, the capacity check, and the ranks settling on the count Slurm gave (no process, no cluster)."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import List

import pytest
from hydra import compose, initialize_config_dir

from hpc_train.compute.runtime.allocation import allocation_mismatch, settle_layout
from hpc_train.compute.runtime.ranks import RankInfo
from hpc_train.compute.settings import section
from hpc_train.conf import CONFIG_DIR
from hpc_train.config.checks import count_or_range, count_range
from hpc_train.config.errors import ConfigError
from hpc_train.contracts.fingerprint import differences, fingerprint
from hpc_train.contracts.job_layout import JobLayout
from hpc_train.contracts.strategy_table import KINDS
from hpc_train.launch.backends.slurm.params import slurm_parameters, submitit_parameters
from hpc_train.launch.backends.slurm.sbatch import check_allocation
from hpc_train.launch.backends.slurm.script import render_sbatch
from hpc_train.launch.backends.slurm.step import step_python
from hpc_train.launch.planning import capacity
from hpc_train.launch.planning.jobspec import build_job_spec
from hpc_train.launch.planning.parallelism import resolve_parallelism
from hpc_train.launch.planning.plan import RunPlan, make_plan

TINY = ["model=toy_mlp", "data=synthetic", "data.image_size=8", "data.num_samples=64", "trainer.progress=false"]
SLURM = ["launcher=slurm", "dry_run=true", "cluster.cpus_per_gpu=1", "resources.gpus_per_node=1"]


def plan(overrides: List[str], tmp_path: Path) -> RunPlan:
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        cfg = compose(config_name="config", overrides=[*TINY, *SLURM, *overrides])
    return make_plan(cfg, tmp_path / "run")


def refusal(overrides: List[str], tmp_path: Path) -> ConfigError:
    with pytest.raises(ConfigError) as err:
        plan(overrides, tmp_path)
    return err.value


# -- the spelling ------------------------------------------------------------------------------
@pytest.mark.parametrize("value", [1, 4, "2-4", "1-2", "3-3", " 2-4"])
def test_a_count_or_a_range_is_accepted(value):
    assert count_or_range(1, 100_000)(value) is None


@pytest.mark.parametrize(
    "value, problem",
    [
        ("4-2", "MIN below MAX"),
        ("0-3", "start at 1"),
        ("a-b", "range MIN-MAX such as 2-4"),
        ("2-", "range MIN-MAX"),
        ("2-100001", "end at 100000"),
        (0, "at least 1"),
        (1.5, "whole number or a range"),
        (True, "whole number or a range"),
    ],
)
def test_bad_spellings_say_what_is_wrong(value, problem):
    assert problem in count_or_range(1, 100_000)(value)


@pytest.mark.parametrize("value", ["4-2", "0-3", "a-b", "2-"])
def test_bad_spellings_are_refused_before_anything_naming_the_key_and_the_fix(value, tmp_path):
    err = refusal(["strategy=ddp", f"resources.nodes={value}"], tmp_path)
    assert err.key == "resources.nodes" and "resources.nodes=2-4" in err.fix and "MIN < MAX" in err.fix


def test_count_range_reads_both_spellings():
    assert count_range(3) == (3, 3) and count_range("2-4") == (2, 4) and count_range("3-3") == (3, 3)


def test_a_range_of_one_count_is_that_count(tmp_path):
    layout = plan(["strategy=ddp", "resources.nodes=3-3", "trainer.batch_size=24"], tmp_path).layout
    assert (layout.nodes, layout.max_nodes) == (3, None) and slurm_parameters(
        plan(["strategy=ddp", "resources.nodes=3-3", "trainer.batch_size=24"], tmp_path)
    )["nodes"] == 3


# -- which strategies may have a range -----------------------------------------------------------
@pytest.mark.parametrize(
    "strategy",
    [
        ["strategy=single"],
        ["strategy=dp"],
        ["strategy=model_parallel"],
        ["strategy=pipeline"],
        ["strategy=hybrid"],
        ["strategy=pipeline", "strategy.engine=pipelining", "strategy.stages=2"],
    ],
    ids=lambda s: " ".join(s),
)
def test_strategies_whose_checkpoints_keep_their_world_are_refused_a_range(strategy, tmp_path):
    err = refusal([*strategy, "resources.nodes=2-4"], tmp_path)
    assert err.key == "resources.nodes" and "fixed node count" in err.problem
    assert "resources.nodes=" in err.fix and "strategy=ddp, fsdp or mesh" in err.fix


def test_only_any_world_and_sharded_strategies_may_have_a_range(tmp_path):
    allowed = {name for name, kind in KINDS.items() if kind.any_world or kind.sharded}
    assert allowed == {"ddp", "fsdp", "mesh"}


def test_a_script_job_is_refused_a_range(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("print('hi')\n")
    err = refusal(["strategy=ddp", "resources.nodes=2-4", f"script.argv=[{script}]"], tmp_path)
    assert err.key == "resources.nodes" and "script job" in err.problem


def test_a_local_run_is_refused_a_range(tmp_path):
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        cfg = compose(
            config_name="config",
            overrides=[*TINY, "launcher=local", "resources.gpus_per_node=1", "resources.nodes=1-2"],
        )
    with pytest.raises(ConfigError) as err:
        make_plan(cfg, tmp_path / "run")
    assert err.value.key == "resources.nodes" and "launcher=slurm" in err.value.fix


# -- the script Slurm gets --------------------------------------------------------------------
def test_the_job_asks_for_the_range_and_srun_for_the_tasks_of_each_node_it_gets(tmp_path):
    """sbatch gets --nodes=2-4 and each node's CPUs as one task's; srun starts --ntasks-per-node on every node the job
    got. Never a task count: sbatch's --ntasks-per-node would fix one (the least count x the tasks per node)."""
    fsdp = plan(
        [
            "strategy=fsdp",
            "resources.nodes=2-4",
            "resources.gpus_per_node=2",
            "cluster.cpus_per_gpu=3",
            "trainer.batch_size=24",
        ],
        tmp_path,
    )
    params = slurm_parameters(fsdp)
    assert params["nodes"] == "2-4" and params["cpus_per_task"] == 6 and params["gres"] == "gpu:2"
    assert "ntasks_per_node" not in params and "ntasks" not in params
    assert params["srun_args"][:2] == ["--ntasks-per-node=2", "--cpus-per-task=3"]
    script = render_sbatch(tmp_path / "slurm", params)
    assert (
        "#SBATCH --nodes=2-4\n" in script
        and "#SBATCH --cpus-per-task=6\n" in script
        and "--ntasks" not in script.split("# command")[0]
    )
    assert "srun --unbuffered" in script and "--ntasks-per-node=2 --cpus-per-task=3 --kill-on-bad-exit=1" in script
    assert fsdp.layout.describe().startswith("fsdp: 2-4 nodes x 2 tasks/node (world size 4-8)")
    fixed = slurm_parameters(plan(["strategy=ddp", "resources.nodes=2", "trainer.batch_size=24"], tmp_path))
    assert (fixed["nodes"], fixed["ntasks_per_node"], fixed["srun_args"]) == (2, 1, ["--kill-on-bad-exit=1"])


def test_submitit_gets_the_least_count_and_writes_the_range(tmp_path):
    """submitit numbers the job's tasks from `nodes`: it gets the range's least, and --nodes=2-4 through its additional
    parameters; the script it writes is the one the dry run shows."""
    from submitit.slurm.slurm import _make_sbatch_string  # the function submitit writes its script with

    params = slurm_parameters(plan(["strategy=ddp", "resources.nodes=2-4", "trainer.batch_size=24"], tmp_path))
    given = submitit_parameters(params)
    assert given["nodes"] == 2 and given["additional_parameters"]["nodes"] == "2-4"
    assert params["nodes"] == "2-4"  # the caller's parameters are left as they are
    folder = tmp_path / "slurm"
    command = f"{step_python(folder, params)} -u -m submitit.core._submit {shlex.quote(str(folder))}"
    assert _make_sbatch_string(command=command, folder=folder, **given) == render_sbatch(folder, params)


def test_the_job_spec_carries_the_least_count_and_the_range(tmp_path):
    ddp = plan(["strategy=ddp", "resources.nodes=2-4", "trainer.batch_size=24"], tmp_path)
    layout = build_job_spec(ddp, choices={})["job"]["layout"]
    assert (layout["nodes"], layout["max_nodes"], layout["world_size"], layout["data_parallel_size"]) == (2, 4, 2, 2)
    assert section(JobLayout, layout).max_nodes == 4


# -- the checks, at every count -----------------------------------------------------------------
def test_a_batch_that_does_not_split_at_one_count_names_it_and_a_batch_that_splits_at_all(tmp_path):
    err = refusal(["strategy=ddp", "resources.nodes=2-4", "trainer.batch_size=16"], tmp_path)
    assert err.key == "trainer.batch_size" and err.problem.startswith("with 3 nodes, which resources.nodes=2-4")
    assert "world size 3" in err.problem and "use a multiple of 12, e.g. trainer.batch_size=12" in err.fix
    assert "e.g. resources.nodes=2." in err.fix


def test_the_narrower_range_is_the_counts_before_the_one_that_fails(tmp_path):
    err = refusal(["strategy=ddp", "resources.nodes=2-6", "trainer.batch_size=24"], tmp_path)  # 2, 3, 4 split 24; 5 not
    assert err.problem.startswith("with 5 nodes") and "e.g. resources.nodes=2-4." in err.fix


def test_a_batch_that_splits_at_every_count_is_accepted(tmp_path):
    assert plan(["strategy=ddp", "resources.nodes=2-4", "trainer.batch_size=24"], tmp_path).layout.max_nodes == 4


def test_mesh_dimensions_must_resolve_at_every_count(tmp_path):
    mesh = ["strategy=mesh", "resources.gpus_per_node=2", "trainer.batch_size=48"]
    err = refusal([*mesh, "resources.nodes=2-4", "strategy.dp_shard=4"], tmp_path)
    assert (
        err.key == "strategy.dp_shard" and err.problem.startswith("with 3 nodes") and "strategy.dp_shard=-1" in err.fix
    )
    layout = plan([*mesh, "resources.nodes=2-4"], tmp_path).layout  # dp_shard=-1: whatever each count leaves
    assert layout.mesh == (1, 1, 4, 1) and "resolved again for the nodes Slurm gives" in layout.describe()


def test_fsdp_replicas_must_divide_every_count(tmp_path):
    fsdp = ["strategy=fsdp", "resources.gpus_per_node=2", "trainer.batch_size=48"]
    assert plan([*fsdp, "resources.nodes=2-4", "strategy.replicate=nodes"], tmp_path).layout.mesh == (2, 2)
    err = refusal([*fsdp, "resources.nodes=2-3", "strategy.replicate=4"], tmp_path)
    assert err.key == "strategy.replicate" and err.problem.startswith("with 3 nodes")


# -- the capacity check -----------------------------------------------------------------------
PARTITION = {
    "debug": capacity.Partition("debug", True, None, tuple(capacity.Node(f"n{i}", 16, 16, 8000, 4) for i in range(4)))
}
REQUEST = {"ntasks_per_node": 1, "cpus_per_task": 1, "gres": "gpu:1", "time": 10}


def test_a_range_starts_once_its_least_fits():
    capacity.check_capacity({**REQUEST, "nodes": "2-8"}, "resources.time", PARTITION)  # Slurm gives at most 4
    with pytest.raises(ConfigError) as err:
        capacity.check_capacity({**REQUEST, "nodes": "6-8"}, "resources.time", PARTITION)
    assert err.value.key == "resources.nodes" and "at least 6 nodes (6-8)" in err.value.problem
    assert "resources.nodes=4 or fewer, or a range whose least fits, e.g. resources.nodes=2-4" in err.value.fix


def test_the_hydra_launchers_whole_node_count_is_checked_as_before():
    capacity.check_capacity({**REQUEST, "nodes": 4}, "hydra.launcher.timeout_min", PARTITION, capacity.APP_KEYS)
    with pytest.raises(ConfigError) as err:
        capacity.check_capacity({**REQUEST, "nodes": 5}, "hydra.launcher.timeout_min", PARTITION, capacity.APP_KEYS)
    assert err.value.key == "hydra.launcher.nodes" and "hydra.launcher.nodes=4 or fewer" in err.value.fix


# -- a plain sbatch script's allocation (launcher=sbatch) -------------------------------------------
def test_a_plain_sbatch_allocation_of_any_count_of_the_range_is_accepted(tmp_path):
    layout = plan(["strategy=ddp", "resources.nodes=2-4", "trainer.batch_size=24"], tmp_path).layout
    assert check_allocation(layout, {"SLURM_JOB_ID": "1", "SLURM_NNODES": "3", "SLURM_NTASKS": "3"}) == []
    with pytest.raises(ConfigError) as err:
        check_allocation(layout, {"SLURM_JOB_ID": "1", "SLURM_NNODES": "5", "SLURM_NTASKS": "5"})
    assert err.value.key == "resources.nodes" and "#SBATCH --nodes=2-4" in err.value.fix
    with pytest.raises(ConfigError):
        check_allocation(layout, {"SLURM_JOB_ID": "1", "SLURM_NNODES": "3", "SLURM_NTASKS": "6"})


# -- the ranks: the count Slurm gave ------------------------------------------------------------
def slurm_ranks(world: int, per_node: int) -> RankInfo:
    return RankInfo(0, 0, world, per_node, "hpcnode1", 29500, "slurm")


@pytest.mark.parametrize(
    "overrides",
    [
        ["strategy=ddp"],
        ["strategy=fsdp"],
        ["strategy=fsdp", "strategy.replicate=nodes"],
        ["strategy=mesh"],
        ["strategy=mesh", "strategy.tp=2", "strategy.tp_plan={0:colwise}"],
    ],
    ids=" ".join,
)
def test_each_rank_settles_on_the_layout_the_login_node_checked_for_its_count(overrides, tmp_path):
    """The ranks' layout at each count is the login node's resolution at that count: nodes, world, data-parallel
    size, fsdp's replicas (HSDP's replicate=nodes: one replica a node), mesh's dp_shard=-1."""
    ranged = plan([*overrides, "resources.gpus_per_node=2", "resources.nodes=2-4", "trainer.batch_size=48"], tmp_path)
    spec = build_job_spec(ranged, choices={})
    planned = section(JobLayout, spec["job"]["layout"])
    for count in (2, 3, 4):
        login = resolve_parallelism(ranged.config.strategy, count, 2, 1, local=False)
        ranks = settle_layout(planned, spec["strategy"], count * 2)
        assert (ranks.nodes, ranks.world_size, ranks.data_parallel_size) == (count, count * 2, login.data_parallel_size)
        assert (tuple(ranks.mesh) if ranks.mesh is not None else None) == login.layout.mesh
        assert allocation_mismatch(planned, slurm_ranks(count * 2, 2)) is None


def test_a_world_outside_the_range_is_refused_naming_the_range(tmp_path):
    planned = section(
        JobLayout,
        build_job_spec(
            plan(
                ["strategy=ddp", "resources.nodes=2-4", "resources.gpus_per_node=2", "trainer.batch_size=48"], tmp_path
            ),
            choices={},
        )["job"]["layout"],
    )
    for world in (2, 5, 10):
        problem = allocation_mismatch(planned, slurm_ranks(world, 2))
        assert problem is not None and "planned for 4 to 8, 2 a node, rank(s)" in problem
        assert settle_layout(planned, {}, world) == planned  # left as planned: the refusal comes first


def test_a_fixed_layout_is_left_as_it_is(tmp_path):
    planned = section(
        JobLayout,
        build_job_spec(plan(["strategy=ddp", "resources.nodes=2", "trainer.batch_size=24"], tmp_path), choices={})[
            "job"
        ]["layout"],
    )
    assert settle_layout(planned, {}, 2) == planned and allocation_mismatch(planned, slurm_ranks(2, 1)) is None
    assert "planned for 2 rank(s)" in allocation_mismatch(planned, slurm_ranks(3, 1))


# -- the fingerprint: a resumed run at another count is the same run --------------------------------
@pytest.mark.parametrize("strategy", ["ddp", "fsdp", "mesh"])
def test_the_node_count_a_range_gives_leaves_the_fingerprint_as_it_is(strategy, tmp_path):
    two = build_job_spec(
        plan([f"strategy={strategy}", "resources.nodes=2-4", "trainer.batch_size=24"], tmp_path), choices={}
    )
    kind = KINDS[strategy]
    at_two = fingerprint(two, 2, sharded=kind.sharded, any_world=kind.any_world)
    at_four = fingerprint(two, 4, sharded=kind.sharded, any_world=kind.any_world)
    assert differences(at_two, at_four) == [] and not any(key.startswith("resources") for key in at_two)
