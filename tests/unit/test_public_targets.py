"""The public names a config's `_target_` may use (hpc_train.steps, .models, .datasets), the paths documented before
them still working, and a `_target_` under hpc_train. that names nothing refused at the login node, read from the
source without importing it. Every `_target_` the docs and the shipped configs show resolves."""

from __future__ import annotations

import builtins
import re
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.utils import get_object

from hpc_train.conf import CONFIG_DIR
from hpc_train.config import engine
from hpc_train.config.errors import ConfigError
from hpc_train.config.targets import PUBLIC_TARGETS, TARGET_ARGS, missing_target
from tests.support.paths import REPO

# `_target_: hpc_train.x.y` (YAML), `_target_=hpc_train.x.y` or `{_target_:hpc_train.x.y,...}` (command lines)
_TARGET = re.compile(r"_target_\s*[:=]\s*['\"]?(hpc_train(?:\.\w+)+)")


def _shown_targets():
    files = [REPO / "README.md", *(REPO / "docs").rglob("*.md"), *(REPO / "conf").rglob("*.yaml")]
    files += [p for p in (REPO / "examples").rglob("*") if p.is_file() and p.suffix in (".md", ".yaml", ".py", ".sh")]
    found = {}
    for path in files:
        for target in _TARGET.findall(path.read_text(encoding="utf-8")):
            found.setdefault(target, str(path.relative_to(REPO)))
    return found


SHOWN = _shown_targets()


def test_the_docs_and_configs_show_the_public_names():
    assert set(PUBLIC_TARGETS) <= set(SHOWN), f"never shown: {sorted(set(PUBLIC_TARGETS) - set(SHOWN))}"


@pytest.mark.parametrize("target", sorted(SHOWN))
def test_every_target_the_docs_and_the_shipped_configs_show_resolves(target):
    assert get_object(target) is not None, f"{SHOWN[target]}: {target}"
    assert missing_target(target) is None, f"{SHOWN[target]}: {target} is refused at the login node"


@pytest.mark.parametrize("public, internal", sorted(PUBLIC_TARGETS.items()))
def test_a_public_name_and_its_internal_path_are_the_same_function(public, internal):
    assert get_object(public) is get_object(internal)
    assert missing_target(internal) is None and missing_target(public) is None


def test_the_documented_step_path_still_works():
    from hpc_train.compute.training.steps import model_loss

    assert get_object("hpc_train.steps.model_loss") is model_loss
    assert get_object("hpc_train.compute.training.steps.model_loss") is model_loss


def test_the_arguments_of_a_shipped_target_are_checked_under_its_internal_path_too():
    assert "hpc_train.models.toy_mlp" in TARGET_ARGS
    plain = {"model": {"_target_": "hpc_train.compute.models.toy_mlp", "hidden": 0}}
    with pytest.raises(ConfigError) as err:
        engine.check_target_args(plain)
    assert err.value.key == "model.hidden"


@pytest.mark.parametrize(
    "target, close",
    [
        ("hpc_train.steps.model_los", "hpc_train.steps.model_loss"),
        ("hpc_train.step.model_loss", "hpc_train.steps.model_loss"),
        ("hpc_train.compute.datasets.digit", "hpc_train.datasets.digits"),
        ("hpc_train.datasets", "hpc_train.datasets.digits"),  # a module, not a function
    ],
)
def test_a_target_under_hpc_train_that_names_nothing_is_refused_with_the_closest_name(target, close):
    missing = missing_target(target)
    assert missing is not None and missing[1] == close


def _no_heavy_imports(monkeypatch):
    real = builtins.__import__

    def refuse(name, *args, **kwargs):
        assert not name.startswith(("torch", "hpc_train.compute")), f"the login side imported {name}"
        return real(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", refuse)


def test_a_misspelt_target_is_refused_at_the_login_node_naming_its_key_and_the_fix(monkeypatch):
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        cfg = compose(
            config_name="config",
            overrides=["+trainer.step={_target_:hpc_train.steps.model_los,_partial_:true}"],
        )
    _no_heavy_imports(monkeypatch)
    with pytest.raises(ConfigError) as err:
        engine.checked_view(cfg)
    assert err.value.key == "trainer.step._target_"
    assert "hpc_train.steps.model_loss" in err.value.fix, err.value.message
    assert "`trainer.step._target_`" in err.value.message


def test_a_sweep_job_that_changes_a_target_is_checked_again(monkeypatch):
    _no_heavy_imports(monkeypatch)
    plain = {"model": {"_target_": "hpc_train.models.toy_mpl"}, "data": {"train": {"_target_": "my_pkg.Data"}}}
    engine.check_changed({"data": plain["data"]}, [("data",)])  # my own: not checked here
    with pytest.raises(ConfigError) as err:
        engine.check_changed(plain, [("model", "_target_")])
    assert err.value.key == "model._target_" and "hpc_train.models.toy_mlp" in err.value.fix


def test_the_public_names_are_listed_where_the_architecture_page_says():
    text = Path(REPO / "docs" / "architecture.md").read_text(encoding="utf-8")
    section = text.split("## Public names", 1)[1].split("\n## ", 1)[0]
    for public in PUBLIC_TARGETS:
        assert public.rsplit(".", 1)[1] in section
