"""The mesh strategy's dimensions, resolved once at the login node: the rank order, each rank's data shard, and
every refusal the config alone can show (the model's own limits are checked by the ranks: test_tp_plan_checks)."""

from __future__ import annotations

import pytest

from hpc_train.config.errors import ConfigError
from hpc_train.contracts.mesh_dims import MeshDims, resolve_mesh_dims, torch_too_old
from hpc_train.launch.planning.parallelism import resolve_parallelism

MESH = {
    "name": "mesh",
    "backend": "auto",
    "dp_replicate": 1,
    "dp_shard": -1,
    "tp": 1,
    "pp": 1,
    "tp_plan": None,
    "split_points": None,
    "chunks": 4,
    "balance": "params",
    "schedule": "gpipe",
}


def mesh(**keys):
    return {**MESH, **keys}


def test_ranks_are_numbered_pipeline_outermost_and_tensor_parallel_innermost():
    dims = MeshDims(pp=2, dp_replicate=1, dp_shard=2, tp=2)
    assert [dims.coordinates(r) for r in (0, 1, 2, 5, 7)] == [
        {"pp": 0, "dp_replicate": 0, "dp_shard": 0, "tp": 0},
        {"pp": 0, "dp_replicate": 0, "dp_shard": 0, "tp": 1},
        {"pp": 0, "dp_replicate": 0, "dp_shard": 1, "tp": 0},
        {"pp": 1, "dp_replicate": 0, "dp_shard": 0, "tp": 1},
        {"pp": 1, "dp_replicate": 0, "dp_shard": 1, "tp": 1},
    ]


def test_a_tp_group_and_a_pipelines_stages_read_the_same_data_shard():
    dims = MeshDims(pp=2, dp_replicate=2, dp_shard=1, tp=2)
    shards = [dims.data_shard(r) for r in range(dims.world_size)]
    assert shards == [(0, 2), (0, 2), (1, 2), (1, 2)] * 2  # tp pairs share; stage 1 (ranks 4-7) repeats stage 0


def test_dp_shard_minus_one_takes_what_the_world_leaves():
    assert resolve_mesh_dims(mesh(tp=2, pp=2), 16, 8) == MeshDims(pp=2, dp_replicate=1, dp_shard=4, tp=2)


@pytest.mark.parametrize(
    "keys, world, per_node, key, fix",
    [
        ({"tp": 3}, 8, 8, "strategy.dp_shard", "product divides 8"),
        ({"tp": 2, "dp_shard": 3}, 8, 8, "strategy.dp_shard", "strategy.dp_shard=-1"),
        ({"tp": 4, "dp_shard": 2}, 8, 2, "strategy.tp", "divisors of 2"),
    ],
)
def test_dimensions_that_do_not_fit_the_world_are_refused_with_the_key(keys, world, per_node, key, fix):
    with pytest.raises(ConfigError) as err:
        resolve_mesh_dims(mesh(**keys), world, per_node)
    assert err.value.key == key and fix in err.value.fix


def test_the_layout_is_one_rank_per_gpu_with_the_dimensions_on_it():
    plan = {"layers.*.wq": "colwise"}
    parallel = resolve_parallelism(mesh(tp=2, pp=2, tp_plan=plan), 2, 4, 8, local=False)
    assert (parallel.layout.nodes, parallel.layout.tasks_per_node, parallel.layout.gpus_per_task) == (2, 4, 1)
    assert parallel.dims == MeshDims(pp=2, dp_replicate=1, dp_shard=2, tp=2)
    assert parallel.data_parallel_size == 2 and parallel.stages == 2 and parallel.chunks == 4
    assert "pp 2 x dp_shard 2 x tp 2" in parallel.layout.describe()


def test_without_pipeline_stages_the_batch_is_not_cut_into_micro_batches():
    parallel = resolve_parallelism(mesh(dp_replicate=2), 1, 4, 1, local=True)
    assert parallel.split is None and parallel.chunks == 1 and parallel.data_parallel_size == 4


@pytest.mark.parametrize(
    "keys, key, fix",
    [
        ({"tp": 2}, "strategy.tp_plan", "tp_plan:"),
        ({"pp": 2, "split_points": ["a", "b"]}, "strategy.pp", "strategy.pp=3"),
        ({"pp": 2, "schedule": "1f1b", "chunks": 1}, "strategy.chunks", "strategy.chunks=2"),
        ({"pp": 2, "balance": [1, 2, 3]}, "strategy.balance", "give 2 positive numbers"),
    ],
)
def test_settings_that_disagree_are_refused_with_the_key(keys, key, fix):
    with pytest.raises(ConfigError) as err:
        resolve_parallelism(mesh(**keys), 1, 4, 1, local=True)
    assert err.value.key == key and fix in err.value.fix


@pytest.mark.parametrize("version, old", [("2.5.1+cu124", True), ("2.6.0", False), ("2.11.0a0+git", False)])
def test_a_torch_older_than_the_mesh_needs_is_told_apart(version, old):
    assert torch_too_old(version) is old
