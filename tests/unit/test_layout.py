"""The layout table of every strategy (pure launch-side logic; the Slurm tests check real jobs)."""

import pytest

from hpc_train.config.errors import ConfigError
from hpc_train.config.strategy import strategy_id
from hpc_train.launch.backends.slurm.params import time_minutes
from hpc_train.launch.planning.layout import compute_layout

# strategy, engine, N, G, S -> nodes, tasks/node, gpus/node (gres), gpus/task
ROWS = [
    ("single", None, 1, 4, None, (1, 1, 1, 1)),
    ("dp", None, 1, 4, None, (1, 1, 4, 4)),
    ("ddp", None, 2, 4, None, (2, 4, 4, 1)),
    ("model_parallel", None, 1, 4, None, (1, 1, 4, 4)),
    ("pipeline", None, 1, 2, None, (1, 1, 2, 2)),
    ("hybrid", None, 2, 4, 2, (2, 2, 4, 2)),
    ("pipeline", "pipelining", 2, 4, 2, (2, 4, 4, 1)),
]


@pytest.mark.parametrize("strategy, engine, nodes, gpus, stages, expected", ROWS)
def test_layout_rows(strategy, engine, nodes, gpus, stages, expected):
    identity = strategy_id({"name": strategy, "engine": engine or "native"})  # what users type -> one identity
    layout = compute_layout(identity, nodes, gpus, cpus_per_gpu=10, stages=stages)
    assert (layout.nodes, layout.tasks_per_node, layout.gpus_per_node, layout.gpus_per_task) == expected
    assert layout.cpus_per_task == 10 * layout.gpus_per_task


@pytest.mark.parametrize("strategy", ["single", "dp", "model_parallel", "pipeline"])
def test_single_node_strategies_refuse_several_nodes(strategy):
    with pytest.raises(ConfigError) as err:
        compute_layout(strategy, 2, 4)
    assert err.value.key == "resources.nodes"


def test_single_node_pipeline_points_to_hybrid_and_pipelining():
    with pytest.raises(ConfigError) as err:
        compute_layout("pipeline", 2, 4)
    assert "strategy=hybrid" in err.value.fix and "engine=pipelining" in err.value.fix


def test_hybrid_stages_must_divide_gpus():
    with pytest.raises(ConfigError) as err:
        compute_layout("hybrid", 1, 4, stages=3)
    assert err.value.key == "strategy.stages"


@pytest.mark.parametrize(
    "text, minutes",
    [(30, 30), ("45", 45), ("01:30:00", 90), ("10:30", 11), ("1-00:00:00", 1440), ("2-12", 3600), ("20:00:00", 1200)],
)
def test_slurm_time_formats(text, minutes):
    assert time_minutes(text) == minutes


@pytest.mark.parametrize("text", ["0", "abc", "00:00:00", "-5"])
def test_bad_slurm_times(text):
    with pytest.raises(ConfigError):
        time_minutes(text)


def test_the_distributed_pipeline_has_an_identity_of_its_own():
    assert strategy_id({"name": "pipeline", "engine": "pipelining"}) == "pipelining"
    assert strategy_id({"name": "pipeline", "engine": "native"}) == "pipeline"
    layout = compute_layout("pipelining", 2, 4, stages=2)
    assert layout.label == "pipeline (engine=pipelining)" and layout.describe().startswith(
        "pipeline (engine=pipelining): 2 nodes"
    )


def test_without_gpus_the_layout_says_cpu_workers():
    layout = compute_layout("ddp", 1, 2)
    assert layout.describe(on_cpus=True) == "ddp: 1 node x 2 tasks/node (world size 2), 2 CPU worker processes (no GPU)"
    assert "GPU/task" in layout.describe()
