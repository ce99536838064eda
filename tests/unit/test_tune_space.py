"""The adaptive sweeper's search space (hpc_train/tune/space.py): Hydra's sweep syntax as Optuna distributions, the
overrides every trial gets, a trial's parameters back as overrides, and the grid sampler's values."""

from __future__ import annotations

import pytest
from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

from hpc_train.errors import ConfigError
from hpc_train.tune.space import SearchSpace, grid, search_space


def _one(sweep: str):
    space = search_space([f"a={sweep}"], {})
    assert space.fixed == [] and list(space.distributions) == ["a"]
    return space.distributions["a"]


@pytest.mark.parametrize(
    "sweep, expected",
    [
        ("choice(adam,sgd)", CategoricalDistribution(["adam", "sgd"])),
        ("adam,sgd", CategoricalDistribution(["adam", "sgd"])),  # a simple list is a choice
        ("1,2,true,null,x", CategoricalDistribution([1, 2, True, None, "x"])),  # Hydra's types kept
        ("range(1,10,2)", IntDistribution(1, 9, step=2)),  # 9: the last value below 10
        ("range(1,4)", IntDistribution(1, 3, step=1)),
        ("range(0.5,2.0,0.5)", CategoricalDistribution([0.5, 1.0, 1.5])),  # floats: each value
        ("interval(0.1,1)", FloatDistribution(0.1, 1.0)),
        ("interval(1,8)", FloatDistribution(1.0, 8.0)),  # an interval is of floats unless tagged int
        ("tag(log,interval(1e-4,1e-1))", FloatDistribution(1e-4, 1e-1, log=True)),
        ("tag(int,interval(1,8))", IntDistribution(1, 8)),
        ("tag(log,int,interval(1,64))", IntDistribution(1, 64, log=True)),
    ],
)
def test_a_sweep_becomes_its_distribution(sweep, expected):
    assert _one(sweep) == expected


def test_a_descending_integer_range_stays_integers():
    # Hydra's basic sweeper runs range(9,0,-3) as 9, 6, 3; a float 9.0 is refused by an int key (trainer.max_steps)
    values = _one("range(9,0,-3)").choices
    assert values == (9, 6, 3) and all(type(v) is int for v in values)


def test_fixed_overrides_are_kept_in_order_and_passed_to_each_trial():
    space = search_space(["b=1", "model=mlp", "a=interval(0.1,1)", "~c", "+d.e=x"], {})
    assert space.fixed == ["b=1", "model=mlp", "~c", "+d.e=x"]
    assert space.overrides({"a": 0.25}) == ["b=1", "model=mlp", "~c", "+d.e=x", "a=0.25"]


def test_an_appended_key_keeps_its_plus_in_the_trials_override():
    space = search_space(["+trainer.extra=interval(0.1,1)"], {})
    assert space.distributions == {"+trainer.extra": FloatDistribution(0.1, 1.0)}
    assert space.overrides({"+trainer.extra": 0.5}) == ["+trainer.extra=0.5"]


def test_the_command_line_wins_over_the_sweepers_params():
    params = {"trainer.lr": "interval(0.1,1)", "trainer.wd": "0.1", "model.width": "choice(8,16)"}
    space = search_space(["trainer.lr=0.3", "trainer.wd=choice(0,0.01)"], params)
    assert space.fixed == ["trainer.lr=0.3"]  # the command line's value: the param's interval is gone
    assert space.distributions == {
        "model.width": CategoricalDistribution([8, 16]),
        "trainer.wd": CategoricalDistribution([0, 0.01]),  # the command line's sweep: the param's 0.1 is gone
    }


def test_a_trials_parameters_render_as_hydra_reads_them():
    space = SearchSpace(fixed=["x=1"], distributions={})
    params = {"flag": True, "off": False, "none": None, "lr": 0.001, "n": 4, "name": "adam"}
    assert space.overrides(params) == ["x=1", "flag=true", "off=false", "none=null", "lr=0.001", "n=4", "name=adam"]


def test_the_grid_lists_each_parameters_values():
    space = search_space(["a=choice(x,y)", "b=range(1,10,4)", "c=tag(int,interval(2,4))", "d=0"], {})
    assert grid(space) == {"a": ["x", "y"], "b": [1, 5, 9], "c": [2, 3, 4]}


@pytest.mark.parametrize("sweep", ["interval(0.1,1)", "tag(log,interval(1e-4,1e-1))", "tag(log,int,interval(1,64))"])
def test_the_grid_refuses_a_continuous_interval(sweep):
    with pytest.raises(ConfigError) as err:
        grid(search_space(["a=choice(1,2)", f"trainer.lr={sweep}"], {}))
    assert err.value.key == "hydra.sweeper.sampler"
    assert "trainer.lr" in str(err.value) and "choice(...) or range(...)" in err.value.fix


@pytest.mark.parametrize("params", [{"a": "choice(1,2"}, {"a": "interval(0.1)"}, {"a": "range(1,2,3,4)"}])
def test_a_bad_sweep_is_refused_naming_the_params(params):
    with pytest.raises(ConfigError) as err:
        search_space([], params)
    assert err.value.key == "hydra.sweeper.params"
    assert "sweep syntax" in err.value.fix


@pytest.mark.parametrize(
    "sweep, fix",
    [
        ("glob(*)", "use choice, range or interval"),
        ("choice(x,[1,2])", "choose among numbers, strings or booleans"),
        ("range(5,1)", "give a range that holds one"),
    ],
)
def test_a_sweep_the_sweeper_cannot_sample_is_refused_naming_its_key(sweep, fix):
    with pytest.raises(ConfigError) as err:
        search_space([f"trainer.lr={sweep}"], {})
    assert err.value.key == "trainer.lr"
    assert fix in err.value.fix
