"""Each configuration key is declared once (hpc_train.launch.schema.RULES), documented, and the
shipped YAML agrees with its declaration; a config that leaves keys out runs with the declared defaults."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import yaml

from hpc_train import fingerprint
from hpc_train.launch import schema

from tests.support.paths import REPO, SRC

CONF = REPO / "conf"
OPTIONS = sorted(CONF.glob("*/*.yaml"))


def _matches(pattern: str, key: str) -> bool:
    parts, wanted = key.split("."), pattern.split(".")
    return len(parts) == len(wanted) and all(p in ("*", q) for p, q in zip(wanted, parts))


def _declarations(key: str) -> list:
    return [rule for rule in schema.RULES if _matches(rule.key, key)]


def _shipped_keys(path: Path):
    """(dotted key, value, _target_ of the node it is an argument of) of every key an option sets."""
    data = yaml.safe_load(path.read_text()) or {}
    group = "" if path.parent == CONF else path.parent.name

    def walk(prefix: str, node: dict, target: str):
        for name, value in node.items():
            if name in ("defaults", "hydra"):
                continue
            key = f"{prefix}.{name}" if prefix else str(name)
            if isinstance(value, dict) and not _declarations(key):
                yield from walk(key, value, str(value.get("_target_", "")))
            else:
                yield key, value, target

    data_target = str(data.get("_target_", "")) if isinstance(data, dict) else ""
    yield from walk(group, data, data_target)


@pytest.mark.parametrize("path", [CONF / "config.yaml", *OPTIONS], ids=lambda p: f"{p.parent.name}/{p.name}")
def test_every_shipped_key_is_declared_once_and_its_value_passes_its_declaration(path):
    for key, value, target in _shipped_keys(path):
        rules = _declarations(key)
        if key.endswith("_target_"):
            continue  # the node's own class, checked as part of the node (schema.target_node)
        if not rules:
            check, _, doc = schema.TARGET_ARGS.get(target, {}).get(key.rsplit(".", 1)[1], (None, None, None))
            assert check is not None, f"{path.name}: {key} is not declared in schema.RULES or schema.TARGET_ARGS"
            assert doc, f"{key}: an argument of {target} without a doc"
            rules = [schema.Rule(key, check, "", doc=doc)]
        assert len(rules) == 1, f"{key} is declared {len(rules)} times: {[r.key for r in rules]}"
        rule = rules[0]
        if "${" in repr(value) or value == "???":
            continue  # checked resolved, where every option is composed (test_config.test_every_option_composes)
        if value is None and rule.null is not None:
            continue
        if value is None and rule.has_default and rule.default is None:
            continue
        assert rule.check(value) is None, f"{path.name}: {key}={value!r}: {rule.check(value)}"


def test_every_declaration_has_one_key_a_one_line_doc_and_a_type():
    keys = [rule.key for rule in schema.RULES]
    assert len(keys) == len(set(keys)), sorted(k for k in keys if keys.count(k) > 1)
    for rule in schema.RULES:
        assert rule.doc and "\n" not in rule.doc and rule.doc.endswith("."), f"{rule.key}: doc {rule.doc!r}"
        assert schema.type_text(rule.check) != "see the description" or rule.check is schema.DECLARED_ONLY, rule.key
        assert not (rule.required and rule.has_default), f"{rule.key}: required keys have no default"
    for target, args in schema.TARGET_ARGS.items():
        for name, (_, _, doc) in args.items():
            assert doc and doc.endswith("."), f"{target}({name}=...): doc {doc!r}"


@pytest.mark.parametrize("group", ["trainer", "resources", "script"])
def test_the_one_option_of_a_group_ships_the_declared_defaults(group):
    """A group with a single option: its values are the ones a config without the key runs with."""
    (path,) = sorted((CONF / group).glob("*.yaml"))
    for key, value, _ in _shipped_keys(path):
        (rule,) = _declarations(key)
        if rule.has_default:
            assert value == rule.default, f"{path.name}: {key}={value!r} but schema declares default {rule.default!r}"


def test_every_declared_key_is_in_the_generated_reference_with_its_doc():
    spec = importlib.util.spec_from_file_location("config_reference", REPO / "docs" / "hooks" / "config_reference.py")
    hook = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hook)
    page = hook.reference()
    for rule in schema.RULES:
        assert f"| `{rule.key}` |" in page, rule.key
        assert hook.text(rule.doc) in page, rule.key


def test_a_config_that_leaves_keys_out_runs_with_the_declared_defaults():
    plain = {
        "strategy": {"name": "pipeline"},
        "trainer": {"batch_size": 8},
        "launcher": {"name": "local"},
        "data": {"train": {"_target_": "x.Y"}},
    }
    filled = schema.complete(plain)
    assert plain["strategy"]["chunks"] == 4 and plain["strategy"]["engine"] == "native"
    assert "replicate" not in plain["strategy"], "an fsdp key is not given to a pipeline"
    assert "schedule" not in plain["strategy"], "a pipelining key is not given to the native pipeline"
    assert plain["trainer"]["grad_accum_steps"] == 1 and plain["trainer"]["hang_timeout_s"] == "auto"
    assert plain["launcher"]["signal"] == "USR2" and plain["launcher"]["signal_delay_s"] == 120
    assert plain["data"]["num_workers"] == 0 and plain["data"]["val"] is None
    assert "script" not in plain, "a section the config does not have is not invented"
    assert schema.complete(plain) == [] and "strategy.chunks" in filled
    assert set(filled) <= set(schema.DEFAULTS)


def test_a_checkpoint_written_before_a_key_was_filled_in_still_matches():
    """Fingerprints of old checkpoints lack the keys complete() now fills: absent reads as the declared default."""
    spec = {
        "model": {"_target_": "m"},
        "strategy": {"name": "single"},
        "data": {"train": {"_target_": "d"}},
        "trainer": {"batch_size": 8, "optimizer": "sgd"},
        "seed": 0,
    }
    old = fingerprint.fingerprint(spec, 1)
    schema.complete(spec)
    assert spec["strategy"]["backend"] == "auto" and spec["data"]["num_workers"] == 0
    new = fingerprint.fingerprint(spec, 1)
    assert new != old and fingerprint.differences(old, new) == []
    spec["data"]["num_workers"] = 4  # a real change is still one
    assert fingerprint.differences(old, fingerprint.fingerprint(spec, 1)) == [
        "data.num_workers: checkpoint 0, this run 4"
    ]
