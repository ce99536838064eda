"""The layouts a job could run with (hpc_train.launch.planning.candidates): every kind the world allows, each
resolved and checked by the project's own layout rules, as the overrides to paste."""

from __future__ import annotations

from typing import List

from hydra import compose, initialize_config_dir

from hpc_train.conf import CONFIG_DIR
from hpc_train.config.engine import checked_view
from hpc_train.launch.planning.candidates import layout_candidates, shipped_strategy

TP_MESH = ("my_tp", {**shipped_strategy("mesh"), "tp_plan": {"layers.*.wq": "colwise"}})


def candidates(overrides: List[str], **kwargs):
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        view = checked_view(compose(config_name="config", overrides=["resources.gpus_per_node=4", *overrides]))
    return layout_candidates(view, **kwargs)


def words(overrides: List[str], **kwargs) -> List[str]:
    return [candidate.words for candidate in candidates(overrides, **kwargs)]


def test_a_users_mesh_option_is_given_every_dimension_the_shipped_mesh_only_what_differs():
    # the user's option may set its own (tp: 2 in the llama example): a pipeline without tp says tp=1
    own = {c.words: c.overrides for c in candidates(["trainer.batch_size=8"], mesh=TP_MESH, search=("pp",))}
    assert own["pp 2 x dp_shard 2, 2 chunks"] == (
        "strategy=my_tp",
        "strategy.pp=2",
        "strategy.dp_replicate=1",
        "strategy.dp_shard=-1",
        "strategy.tp=1",
        "strategy.chunks=2",
    )
    shipped = {c.words: c.overrides for c in candidates(["trainer.batch_size=8"], search=("pp",))}
    assert shipped["pp 2 x dp_shard 2, 2 chunks"] == ("strategy=mesh", "strategy.pp=2", "strategy.chunks=2")


def test_four_ranks_give_ddp_fsdp_and_the_meshs_tp_and_pp_products_as_overrides():
    found = words(["trainer.batch_size=8"], mesh=TP_MESH)
    assert found[:2] == ["ddp x 4", "fsdp 4"]
    assert {
        "dp_shard 2 x tp 2",
        "tp 4",
        "pp 2 x dp_shard 2, 2 chunks",
        "pp 2 x tp 2, 4 chunks",
        "pp 4, 8 chunks",
    } <= set(found)
    assert not any("hsdp" in text for text in found)  # one node: no replicas of shards


def test_tensor_parallel_needs_the_options_plan_and_the_layout_rules_drop_what_they_refuse():
    assert not any("tp" in text.split(" x ") or text.startswith("tp") for text in words(["trainer.batch_size=8"]))
    # 6 samples do not split over 4 data-parallel ranks: only the layouts with 2 or 1 stay
    assert words(["trainer.batch_size=6"], mesh=TP_MESH, search=("ddp", "fsdp", "tp")) == ["dp_shard 2 x tp 2", "tp 4"]
