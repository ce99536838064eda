"""The search space, in Hydra's sweep syntax, as Optuna distributions; a trial's parameters back as overrides.

``key=choice(a,b)`` or ``key=a,b``: categorical; ``key=range(1,9,2)``: integers from 1 below 9 by 2;
``key=interval(0.1,1)``: a float in [0.1, 1]; ``tag(log, interval(...))``: on a log scale; ``tag(int, interval(...))``:
an integer. Overrides that sweep nothing are the trials' fixed part. Parsing is Hydra's (its overrides parser).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Sequence

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import ChoiceSweep, IntervalSweep, Override, RangeSweep
from hydra.errors import HydraException
from optuna.distributions import BaseDistribution, CategoricalDistribution, FloatDistribution, IntDistribution

from hpc_train.errors import ConfigError


@dataclass(frozen=True)
class SearchSpace:
    fixed: List[str]  # the overrides every trial gets
    distributions: Dict[str, BaseDistribution]  # override key (as written, `+` included) -> its distribution

    def overrides(self, params: Mapping[str, Any]) -> List[str]:
        """A trial's command line: the fixed overrides, then its parameters."""
        return [*self.fixed, *(f"{key}={_text(value)}" for key, value in params.items())]


def search_space(arguments: Sequence[str], params: Mapping[str, str]) -> SearchSpace:
    """The command line's overrides and ``hydra.sweeper.params`` (the command line wins for a key in both)."""
    parsed = _parse([*(f"{key}={value}" for key, value in params.items()), *arguments])
    fixed: Dict[str, str] = {}
    distributions: Dict[str, BaseDistribution] = {}
    for override in parsed:
        key = override.get_key_element()
        fixed.pop(key, None)
        distributions.pop(key, None)
        if override.is_sweep_override():
            distributions[key] = distribution(key, override.value())
        else:
            fixed[key] = override.input_line or f"{key}={override.get_value_element_as_str()}"
    return SearchSpace(list(fixed.values()), distributions)


def grid(space: SearchSpace) -> Dict[str, List[Any]]:
    """Every value of each parameter, for the grid sampler (categorical and stepped parameters only)."""
    values: Dict[str, List[Any]] = {}
    for key, dist in space.distributions.items():
        if isinstance(dist, CategoricalDistribution):
            values[key] = list(dist.choices)
        elif isinstance(dist, IntDistribution) and not dist.log:
            values[key] = list(range(dist.low, dist.high + 1, dist.step))
        else:
            raise ConfigError(
                "hydra.sweeper.sampler",
                f"the grid sampler cannot list the values of {key} (a continuous interval).",
                f"sweep {key} with choice(...) or range(...), or pick another sampler (tpe, random).",
            )
    return values


def distribution(key: str, sweep: Any) -> BaseDistribution:
    if isinstance(sweep, ChoiceSweep):
        return CategoricalDistribution([_plain(key, value) for value in sweep.list])
    if isinstance(sweep, RangeSweep):
        return _range(key, sweep)
    if isinstance(sweep, IntervalSweep):
        log, whole = "log" in sweep.tags, "int" in sweep.tags
        if whole:
            return IntDistribution(int(sweep.start), int(sweep.end), log=log)
        return FloatDistribution(float(sweep.start), float(sweep.end), log=log)
    raise ConfigError(key, f"{sweep!r} is no sweep the adaptive sweeper knows.", "use choice, range or interval.")


def _range(key: str, sweep: RangeSweep) -> BaseDistribution:
    start, stop, step = sweep.start, sweep.stop, sweep.step
    if all(isinstance(x, int) for x in (start, stop, step)) and step and list(range(start, stop, step)):
        whole = list(range(start, stop, step))
        if step > 0:
            return IntDistribution(start, whole[-1], step=step)
        return CategoricalDistribution(whole)  # descending: the values as Hydra's basic sweeper gives them
    values = []
    value = float(start)
    while (step > 0 and value < stop) or (step < 0 and value > stop):
        values.append(value)
        value += step
    if not values:
        raise ConfigError(key, f"range({start}, {stop}, {step}) holds no value.", "give a range that holds one.")
    return CategoricalDistribution(values)


def _parse(lines: List[str]) -> List[Override]:
    try:
        return OverridesParser.create().parse_overrides(lines)
    except HydraException as err:
        raise ConfigError("hydra.sweeper.params", str(err), "write each parameter in Hydra's sweep syntax.") from None


def _plain(key: str, value: Any) -> Any:
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    raise ConfigError(key, f"the choice {value!r} is not a plain value.", "choose among numbers, strings or booleans.")


def _text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    return str(value)
