"""What a packed sweep's allocations are, resolved in one place (launch.backends.packed.pack_shape) for hpc-train's
launcher.pack.* and a Hydra app's hydra.launcher.pack.* alike, and their plans built by one function
(pack.records.new_plan) for a sweep and for its rerun."""

import pytest

from hpc_train.config.errors import ConfigError
from hpc_train.launch.backends.slurm import packed as pack
from hpc_train.launch.backends.slurm import packed_rerun
from hpc_train.launch.hydra import app_launcher
from hpc_train.pack import records
from hpc_train.pack.records import PackedRun


def test_hpc_trains_pack_keys_are_completed_from_the_cluster_profile():
    cfg = {
        "launcher": {"pack": {"allocations": 2, "nodes": 1, "gpus_per_node": None, "time": None}},
        "cluster": {"gpus_per_node": 4, "cpus_per_gpu": 8, "time": "01:00:00"},
    }
    assert pack.pack_shape(cfg) == pack.PackShape(2, 1, 4, 32, 60, "cluster.time")
    cfg["launcher"]["pack"].update(gpus_per_node=2, time=30, nodes=3)
    assert pack.pack_shape(cfg) == pack.PackShape(2, 3, 2, 16, 30, "launcher.pack.time")
    assert pack.pack_shape({"launcher": {"pack": {"allocations": None}}, "cluster": {}}) is None
    assert pack.pack_shape({"launcher": {}, "cluster": {}}) is None


def test_a_hydra_apps_pack_keys_are_completed_by_the_same_function_from_its_own_settings(monkeypatch):
    calls = []
    real = pack.pack_shape
    monkeypatch.setattr(pack, "pack_shape", lambda cfg, *keys: calls.append(*keys) or real(cfg, *keys))
    launcher = {"pack": {"allocations": 3, "gpus_per_node": 2}, "timeout_min": 5, "cpus_per_gpu": 3}
    assert app_launcher.pack_shape(launcher) == pack.PackShape(3, 1, 2, 6, 5, "hydra.launcher.timeout_min")
    assert app_launcher.pack_shape({**launcher, "pack": {**launcher["pack"], "time": "00:10:00"}}).minutes == 10
    assert len(calls) == 2 and calls[0].pack == "hydra.launcher.pack"
    assert app_launcher.pack_shape({"pack": {"allocations": None}}) is None
    assert app_launcher.pack_shape({}) is None


@pytest.mark.parametrize(
    "launcher, key, words",
    [
        ({"pack": {"allocations": 0, "gpus_per_node": 2}}, "hydra.launcher.pack.allocations", "not a positive count"),
        ({"pack": {"allocations": 2, "nodes": 0, "gpus_per_node": 2}}, "hydra.launcher.pack.nodes", "positive"),
        ({"pack": {"allocations": 2}}, "hydra.launcher.pack.gpus_per_node", "gpus_per_node (hydra.launcher.cluster)"),
        ({"pack": {"allocations": 2, "gpus_per_node": 2, "time": "x"}}, "hydra.launcher.pack.time", "not a positive"),
        ({"pack": {"allocations": 2, "gpus_per_node": 2}, "timeout_min": -1}, "hydra.launcher.timeout_min", "-1"),
    ],
)
def test_a_hydra_apps_pack_refusals_name_its_own_keys(launcher, key, words):
    with pytest.raises(ConfigError) as refused:
        app_launcher.pack_shape(launcher)
    assert refused.value.key == key and words in refused.value.message


def test_hpc_trains_pack_refusals_name_its_keys():
    with pytest.raises(ConfigError) as refused:
        pack.pack_shape({"launcher": {"pack": {"allocations": 2}}, "cluster": {"time": 60}})
    assert refused.value.key == "launcher.pack.gpus_per_node" and "(hydra" not in refused.value.message


def run(job: str) -> PackedRun:
    return PackedRun(job, f"/sweep/{job}", f"x={job}", 1, 1, 1, 1, ["python", "job.py", job])


def test_a_sweeps_plans_and_a_reruns_plan_are_built_by_one_function(tmp_path, monkeypatch):
    built = []
    real = records.new_plan
    monkeypatch.setattr(records, "new_plan", lambda *args, **kwargs: built.append(args) or real(*args, **kwargs))
    monkeypatch.setattr(pack.capacity, "check_capacity", lambda *args, **kwargs: None)  # no sinfo here
    shape = pack.PackShape(2, 1, 4, 8, 30, "cluster.time")
    first = {"job_name": "sweep", "nodes": 1, "gpus_per_node": 1, "additional_parameters": {}}
    plans = pack.plan_packed([run("0"), run("1"), run("2")], [first] * 3, [1, 2, 3], shape, tmp_path, "USR2", 90)
    assert len(built) == 2 and [p.index for p, _ in plans] == [0, 1]
    sweep_plan, params = plans[0]
    assert sweep_plan.sbatch == params and params["job_name"] == "sweep-pack0" and sweep_plan.max_requeues == 3
    assert (sweep_plan.nodes, sweep_plan.gpus_per_node, sweep_plan.cpus_per_node, sweep_plan.minutes) == (1, 4, 8, 30)
    new, source = packed_rerun.rerun_plan([p for p, _ in plans], ["1", "2"], 2)
    assert len(built) == 3 and source is plans[1][0] and new.index == 2 and [r.job for r in new.runs] == ["1", "2"]
    assert (new.nodes, new.gpus_per_node, new.cpus_per_node, new.minutes, new.signal, new.signal_delay_s) == (
        1,
        4,
        8,
        30,
        "USR2",
        90,
    )
    assert new.sbatch is None  # pack.submit records what it renders the new allocation's script from
