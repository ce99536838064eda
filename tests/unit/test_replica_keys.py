"""Replica groups on the login side (fault_tolerance.*): each key checked on its own by its declaration, and what the
keys must agree on with the strategy, the layout and the launcher refused before anything is queued, each refusal
naming its key and the fix (launch/planning/replica_checks.py); the node's defaults, and the job spec carrying it. The
check imports neither torch nor torchft. What the groups do at run time: the compute side's tests."""

from __future__ import annotations

import builtins
import importlib
import importlib.util
import shlex
import sys
from pathlib import Path
from typing import List

import pytest
import yaml
from hydra import compose, initialize_config_dir

from hpc_train import config
from hpc_train.conf import CONFIG_DIR
from hpc_train.config import engine
from hpc_train.config import fault_tolerance as keys
from hpc_train.config.engine import whole_mappings
from hpc_train.config.errors import ConfigError
from hpc_train.contracts.replica_plan import ReplicaPlan
from hpc_train.launch.backends.slurm.params import slurm_parameters
from hpc_train.launch.backends.slurm.step import STEP_KEY, step_python
from hpc_train.launch.planning import replica_checks
from hpc_train.launch.planning.jobspec import build_job_spec
from hpc_train.launch.planning.plan import RunPlan, make_plan
from tests.support.paths import REPO

TINY = ["model=toy_mlp", "data=synthetic", "data.image_size=8", "data.num_samples=64", "trainer.progress=false"]
KEY = "fault_tolerance.replica_groups"
SLURM = ["launcher=slurm", "resources.gpus_per_node=4", "trainer.batch_size=96"]


@pytest.fixture(autouse=True)
def no_gpus_here(monkeypatch):
    """The local plans' ranks are CPU workers (no nvidia-smi asked), as on a laptop; torchft found, unless a test
    says otherwise."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    monkeypatch.setattr(replica_checks, "find_spec", lambda name: object() if name == "torchft" else None)


def plan(overrides: List[str], tmp_path: Path) -> RunPlan:
    """What hpc-train checks before anything runs or is queued, in-process (as the CLI passes the overrides)."""
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        cfg = compose(config_name="config", overrides=whole_mappings([*TINY, *overrides]))
    return make_plan(cfg, tmp_path / "run")


def refused(overrides: List[str], tmp_path: Path) -> ConfigError:
    with pytest.raises(ConfigError) as err:
        plan(overrides, tmp_path)
    assert "Fix:" in str(err.value)
    return err.value


# -- accepted -------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "overrides, groups",
    [
        (["resources.gpus_per_node=6", "trainer.batch_size=48", f"{KEY}=3"], 3),  # ddp, 6 local ranks, 3 groups of 2
        (["strategy=fsdp", "resources.gpus_per_node=4", f"{KEY}=2"], 2),  # shards over each group's ranks
        (["strategy=fsdp", "strategy.replicate=2", "resources.gpus_per_node=4", f"{KEY}=2"], 2),  # HSDP = the groups
        (["strategy=mesh", "strategy.dp_replicate=2", "resources.gpus_per_node=4", f"{KEY}=2"], 2),  # they agree
        (["strategy=mesh", "resources.gpus_per_node=4", f"{KEY}=4"], 4),  # dp_replicate left 1: the groups replicate
        ([*SLURM, "resources.nodes=4", f"{KEY}=2"], 2),  # two nodes a group
        ([*SLURM, "resources.nodes=4", f"{KEY}=4", "fault_tolerance.spare_nodes=0"], 4),
        ([*SLURM, "resources.nodes=2", f"{KEY}=2"], 2),  # a node per group (and the spare the job adds)
        (
            [*SLURM, "resources.nodes=2", "strategy=fsdp", "strategy.replicate=nodes", f"{KEY}=2"],
            2,  # HSDP over 2 nodes = the 2 groups
        ),
        (["resources.gpus_per_node=4", f"{KEY}=2", "fault_tolerance.min_replicas=2"], 2),  # min_replicas = R
    ],
    ids=str,
)
def test_replica_groups_the_job_can_run_are_accepted_and_reach_the_job_spec(overrides, groups, tmp_path):
    accepted = plan(overrides, tmp_path)
    spec = build_job_spec(accepted, choices={})
    assert spec["fault_tolerance"]["replica_groups"] == groups
    assert set(spec["fault_tolerance"]) == set(keys.KEYS)


@pytest.mark.parametrize(
    "overrides",
    [
        ["strategy=single", "fault_tolerance.min_replicas=5"],
        ["strategy=pipeline", "resources.gpus_per_node=2"],
        ["launcher=sbatch", "resources.gpus_per_node=4"],
        ["resources.gpus_per_node=3", "trainer.batch_size=48"],
    ],
    ids=str,
)
def test_without_replica_groups_nothing_is_checked(overrides, monkeypatch, tmp_path):
    monkeypatch.setattr(replica_checks, "find_spec", lambda name: None)  # torchft is not needed either
    assert plan(overrides, tmp_path).config.fault_tolerance.replica_groups is None


def test_a_config_without_the_node_runs_without_replica_groups(tmp_path):
    accepted = plan(["~fault_tolerance", "resources.gpus_per_node=2"], tmp_path)
    assert "fault_tolerance" not in build_job_spec(accepted, choices={})


# -- each key on its own --------------------------------------------------------------------------
@pytest.mark.parametrize(
    "override, key, said",
    [
        (f"{KEY}=1", KEY, "must be at least 2"),
        (f"{KEY}=0", KEY, "must be at least 2"),
        (f"{KEY}=true", KEY, "must be a whole number"),
        (f"{KEY}=2.5", KEY, "must be a whole number"),
        (f"{KEY}=two", KEY, "must be a whole number"),
        ("fault_tolerance.min_replicas=0", "fault_tolerance.min_replicas", "must be at least 1"),
        ("fault_tolerance.min_replicas=null", "fault_tolerance.min_replicas", "must be a whole number"),
        ("fault_tolerance.timeout_s=0", "fault_tolerance.timeout_s", "greater than 0"),
        ("fault_tolerance.timeout_s=-5", "fault_tolerance.timeout_s", "greater than 0"),
        ("fault_tolerance.timeout_s=soon", "fault_tolerance.timeout_s", "finite number"),
        ("fault_tolerance.spare_nodes=-1", "fault_tolerance.spare_nodes", "must be at least 0"),
        ("fault_tolerance.max_restarts=-1", "fault_tolerance.max_restarts", "must be at least 0"),
        ("fault_tolerance.max_restarts=1.5", "fault_tolerance.max_restarts", "must be a whole number"),
        ("fault_tolerance=3", "fault_tolerance", "must be a mapping of replica_groups"),
        ("fault_tolerance=null", "fault_tolerance", "must be a mapping of replica_groups"),
        ("+fault_tolerance.replicas=2", "fault_tolerance", "has no key 'replicas'"),
    ],
)
def test_bad_values_are_refused_naming_the_key_and_the_fix(override, key, said, tmp_path):
    err = refused([override], tmp_path)
    assert err.key == key and said in str(err), str(err)


@pytest.mark.parametrize(
    "override, value",
    [(f"{KEY}=2", 2), ("fault_tolerance.timeout_s=0.5", 0.5), ("fault_tolerance.max_restarts=0", 0)],
)
def test_good_values_are_read_as_given(override, value, tmp_path):
    key = override.split("=")[0].split(".")[1]
    accepted = plan([override, "resources.gpus_per_node=2"], tmp_path)
    assert accepted.config.fault_tolerance[key] == value


# -- what the keys must agree on ------------------------------------------------------------------
@pytest.mark.parametrize(
    "strategy",
    [
        ["strategy=single"],
        ["strategy=dp", "resources.gpus_per_node=2"],
        ["strategy=pipeline", "resources.gpus_per_node=2"],
        ["strategy=pipeline", "strategy.engine=pipelining", "resources.gpus_per_node=2", "trainer.batch_size=64"],
        ["strategy=model_parallel", "resources.gpus_per_node=2"],
    ],
    ids=str,
)
def test_a_strategy_that_is_not_data_parallel_is_refused(strategy, tmp_path):
    err = refused([*strategy, f"{KEY}=2"], tmp_path)
    assert err.key == KEY and "use strategy=ddp, fsdp or mesh" in err.fix and f"{KEY}=null" in err.fix


def test_a_script_job_is_refused(tmp_path):
    (tmp_path / "train.py").write_text("print('training')\n")
    err = refused([f"script.argv=[{tmp_path / 'train.py'}]", "resources.gpus_per_node=2", f"{KEY}=2"], tmp_path)
    assert err.key == KEY and "your own script" in err.problem and "trainer loop" in err.problem


@pytest.mark.parametrize(
    "overrides, said, fix",
    [
        (["resources.gpus_per_node=5", "trainer.batch_size=40", f"{KEY}=2"], "do not split evenly", f"{KEY}=5"),
        (["resources.gpus_per_node=6", "trainer.batch_size=48", f"{KEY}=4"], "do not split evenly", f"{KEY}=2, 3"),
        (["resources.gpus_per_node=2", f"{KEY}=3"], "2 ranks (ddp", f"{KEY}=2"),
        (["resources.gpus_per_node=1", f"{KEY}=2"], "1 rank (ddp", "resources.gpus_per_node"),
        (
            [
                "strategy=mesh",
                "strategy.tp=2",
                "strategy.tp_plan={fc1:colwise}",
                "resources.gpus_per_node=4",
                f"{KEY}=4",
            ],
            "2 ranks of data parallelism",  # tp pairs share each batch share: 2 data-parallel ranks, not 4
            f"{KEY}=2",
        ),
    ],
    ids=str,
)
def test_ranks_that_do_not_split_into_the_groups_are_refused(overrides, said, fix, tmp_path):
    err = refused(overrides, tmp_path)
    assert err.key == KEY and said in err.problem and fix in err.fix, str(err)


def test_a_batch_that_does_not_split_over_the_ranks_is_refused_by_the_batch_check(tmp_path):
    """The groups read the same shares of each batch as plain data parallelism: validate's batch check refuses it."""
    err = refused(["resources.gpus_per_node=6", "trainer.batch_size=50", f"{KEY}=3"], tmp_path)
    assert err.key == "trainer.batch_size" and "world size 6" in err.problem


def test_more_min_replicas_than_groups_is_refused(tmp_path):
    err = refused(
        ["resources.gpus_per_node=6", "trainer.batch_size=48", f"{KEY}=3", "fault_tolerance.min_replicas=4"], tmp_path
    )
    assert err.key == "fault_tolerance.min_replicas" and "never step" in err.problem
    assert "fault_tolerance.min_replicas=3 or less" in err.fix


@pytest.mark.parametrize(
    "overrides, said, fix",
    [
        (["resources.nodes=3", f"{KEY}=2"], "3 nodes do not split", "resources.nodes=4"),
        (["resources.nodes=2", f"{KEY}=4"], "fewer than the 4 groups", "resources.nodes=4"),
        (["resources.nodes=1", "resources.gpus_per_node=6", f"{KEY}=3"], "fewer than the 3 groups", "nodes=3"),
        (["resources.nodes=6", f"{KEY}=4"], "6 nodes do not split", f"{KEY}=2"),
        (["resources.nodes=2-4", f"{KEY}=2"], "resources.nodes=2-4", "resources.nodes=2"),
    ],
    ids=str,
)
def test_slurm_groups_of_whole_nodes_only(overrides, said, fix, tmp_path):
    err = refused([*SLURM, *overrides], tmp_path)
    assert err.key == "resources.nodes" and said in err.problem and fix in err.fix, str(err)


def test_packed_runs_are_refused(tmp_path):
    err = refused([*SLURM, "resources.nodes=2", f"{KEY}=2", "launcher.pack.allocations=2"], tmp_path)
    assert err.key == KEY and "launcher.pack" in err.problem and "launcher.pack.allocations=null" in err.fix


def test_a_plain_sbatch_script_is_refused(tmp_path):
    err = refused(["launcher=sbatch", "resources.gpus_per_node=4", f"{KEY}=2"], tmp_path)
    assert err.key == KEY and "launcher=sbatch" in err.problem and "launcher=slurm" in err.fix


@pytest.mark.parametrize(
    "overrides, key, fix",
    [
        (
            ["strategy=mesh", "strategy.dp_replicate=2", "resources.gpus_per_node=8", f"{KEY}=4"],
            "strategy.dp_replicate",
            "strategy.dp_replicate=4",
        ),
        (
            ["strategy=fsdp", "strategy.replicate=4", "resources.gpus_per_node=8", f"{KEY}=2"],
            "strategy.replicate",
            "strategy.replicate=2",
        ),
        (
            [*SLURM, "resources.nodes=4", "strategy=fsdp", "strategy.replicate=nodes", f"{KEY}=2"],
            "strategy.replicate",
            f"{KEY}=4",
        ),
    ],
    ids=str,
)
def test_a_replica_dimension_of_the_strategy_that_disagrees_with_the_groups_is_refused(overrides, key, fix, tmp_path):
    err = refused(overrides, tmp_path)
    assert err.key == key and "refused unless they agree" in err.problem and fix in err.fix, str(err)


def test_torchft_missing_is_refused_with_the_install_command(monkeypatch, tmp_path):
    asked = []
    monkeypatch.setattr(replica_checks, "find_spec", lambda name: asked.append(name))
    err = refused(["resources.gpus_per_node=2", f"{KEY}=2"], tmp_path)
    assert err.key == KEY and "torchft" in err.problem and 'pip install "hpc-train[ft]"' in err.fix
    assert asked == ["torchft"]


def test_torchft_is_looked_up_for_real(monkeypatch, tmp_path):
    """The real lookup (this environment's torchft, found or not), without importing it."""
    monkeypatch.setattr(replica_checks, "find_spec", importlib.util.find_spec)
    installed = importlib.util.find_spec("torchft") is not None
    overrides = ["resources.gpus_per_node=2", f"{KEY}=2"]
    if installed:
        assert plan(overrides, tmp_path).config.fault_tolerance.replica_groups == 2
    else:
        assert 'pip install "hpc-train[ft]"' in refused(overrides, tmp_path).fix


# -- defaults -------------------------------------------------------------------------------------
def test_the_defaults_are_declared_once_and_shipped_as_declared():
    assert {rule.key: rule.default for rule in keys.KEY_RULES} == {
        "fault_tolerance.replica_groups": None,
        "fault_tolerance.min_replicas": 1,
        "fault_tolerance.timeout_s": 60,
        "fault_tolerance.heartbeat_timeout_s": 5,
        "fault_tolerance.spare_nodes": 1,
        "fault_tolerance.max_restarts": 3,
    }
    assert all(config.DEFAULTS[rule.key] == rule.default for rule in keys.KEY_RULES)
    assert "fault_tolerance" not in config.DEFAULTS, "no node is invented for a config without one"
    shipped = yaml.safe_load((REPO / "conf" / "config.yaml").read_text())["fault_tolerance"]
    assert shipped == {rule.key.rsplit(".", 1)[1]: rule.default for rule in keys.KEY_RULES}
    assert all(rule in config.RULES for rule in keys.RULES)


def test_a_node_that_leaves_keys_out_runs_with_their_defaults(tmp_path):
    partial = {"fault_tolerance": {"replica_groups": 3}}
    engine.complete(partial)
    assert partial["fault_tolerance"] == {
        "replica_groups": 3,
        "min_replicas": 1,
        "timeout_s": 60,
        "heartbeat_timeout_s": 5,
        "spare_nodes": 1,
        "max_restarts": 3,
    }
    without = {"trainer": {"batch_size": 8}}
    engine.complete(without)
    assert "fault_tolerance" not in without


def test_the_shipped_config_runs_without_replica_groups(tmp_path):
    spec = build_job_spec(plan(["resources.gpus_per_node=2"], tmp_path), choices={})
    assert spec["fault_tolerance"] == {
        "replica_groups": None,
        "min_replicas": 1,
        "timeout_s": 60,
        "heartbeat_timeout_s": 5,
        "spare_nodes": 1,
        "max_restarts": 3,
    }


# -- the login side imports no torch --------------------------------------------------------------
def test_the_check_imports_neither_torch_nor_torchft(monkeypatch, tmp_path):
    """The module and its check, run on an accepted job: no `import torch` or `import torchft` is asked for (even one
    already in sys.modules would be), and no such module is loaded; torchft is looked up with find_spec."""
    accepted = plan(["resources.gpus_per_node=6", "trainer.batch_size=48", f"{KEY}=3"], tmp_path)
    loaded = {name for name in sys.modules if name.split(".")[0] in ("torch", "torchft")}
    asked: List[str] = []
    real_import = builtins.__import__

    def spy(name, *args, **kwargs):
        if name.split(".")[0] in ("torch", "torchft"):
            asked.append(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", spy)
    module = importlib.reload(replica_checks)  # its module-level imports, under the spy
    try:
        module.check_replica_groups(accepted.config, accepted.parallel)  # the real find_spec("torchft")
    except ConfigError as err:  # an environment without torchft: refused, still without importing anything
        assert "torchft" in err.problem
    finally:
        monkeypatch.undo()
        importlib.reload(replica_checks)
    assert asked == []
    assert {name for name in sys.modules if name.split(".")[0] in ("torch", "torchft")} == loaded


# -- the groups' plan, as the Slurm job and its batch host get it ---------------------------------------------------
def test_the_slurm_job_holds_the_spare_and_its_agent_gets_the_plan_laid_out_from_the_layout(tmp_path):
    """sbatch's nodes are the groups' and the spare; the agent's --replicas is the plan's text, read back typed."""
    planned = plan([*SLURM, "resources.nodes=4", f"{KEY}=2", "fault_tolerance.max_restarts=5"], tmp_path)
    params = slurm_parameters(planned)
    assert params["nodes"] == 5 and params["additional_parameters"]["no-kill"] is True
    groups = ReplicaPlan.from_record(params[STEP_KEY]["replicas"])
    assert (groups.groups, groups.group_nodes, groups.tasks_per_node, groups.max_restarts) == (2, 2, 4, 5)
    words = shlex.split(step_python(tmp_path / "slurm", params).removeprefix("exec "))
    assert ReplicaPlan.from_text(words[words.index("--replicas") + 1]) == groups
