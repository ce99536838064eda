"""The login side's table of the shipped ``_target_`` s' arguments (hpc_train.config.targets.TARGET_ARGS, kept as a
table so the login node never imports torch) names the arguments the real functions take, and accepts their defaults."""

from __future__ import annotations

import importlib
import inspect

import pytest

from hpc_train.config.targets import TARGET_ARGS

# torchvision's builders pass their keyword arguments on to the class they build.
KWARGS_GO_TO = {"torchvision.models.resnet": "torchvision.models.resnet.ResNet"}


def _load(dotted: str):
    module, _, name = dotted.rpartition(".")
    return getattr(importlib.import_module(module), name)


def _parameters(target: str) -> dict:
    """The named parameters `target` accepts, those of the class its **kwargs reach included."""
    function = _load(target)
    params = dict(inspect.signature(function).parameters)
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        builds = KWARGS_GO_TO[function.__module__]
        params.update(inspect.signature(_load(builds)).parameters)
    return {n: p for n, p in params.items() if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD) and n != "self"}


@pytest.mark.parametrize("target", sorted(TARGET_ARGS))
def test_each_declared_argument_is_one_the_function_takes_and_its_default_passes_the_check(target):
    params = _parameters(target)
    declared = TARGET_ARGS[target]
    assert set(declared) <= set(params), f"{target} takes no {sorted(set(declared) - set(params))}"
    if target.startswith("hpc_train."):  # hpc_train's own functions: every argument is declared
        assert set(declared) == set(params), f"{target}: undeclared {sorted(set(params) - set(declared))}"
    for name, (check, _, _) in declared.items():
        default = params[name].default
        if default is not inspect.Parameter.empty:
            assert check(default) is None, f"{target}({name}={default!r}): {check(default)}"
