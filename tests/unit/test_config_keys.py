"""Each configuration key is declared once (hpc_train.config.RULES), documented, says what a config without it
means, and the shipped YAML agrees with its declaration; a config that leaves keys out runs with the declared
defaults."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import yaml

from hpc_train import config
from hpc_train.config import checks, engine, launcher, targets
from hpc_train.config.strategy import micro_batches
from hpc_train.contracts import fingerprint, strategy_table
from tests.support.paths import REPO

CONF = REPO / "conf"
OPTIONS = sorted(CONF.glob("*/*.yaml"))


def _matches(pattern: str, key: str) -> bool:
    parts, wanted = key.split("."), pattern.split(".")
    return len(parts) == len(wanted) and all(p in ("*", q) for p, q in zip(wanted, parts))


def _declarations(key: str) -> list:
    return [rule for rule in config.RULES if _matches(rule.key, key)]


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
            continue  # the node's own class, checked as part of the node (checks.target_node)
        if not rules:
            check, _, doc = targets.TARGET_ARGS.get(target, {}).get(key.rsplit(".", 1)[1], (None, None, None))
            assert check is not None, f"{path.name}: {key} is not declared in hpc_train.config (RULES or TARGET_ARGS)"
            assert doc, f"{key}: an argument of {target} without a doc"
            rules = [config.Rule(key, check, "", doc=doc)]
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
    keys = [rule.key for rule in config.RULES]
    assert len(keys) == len(set(keys)), sorted(k for k in keys if keys.count(k) > 1)
    for rule in config.RULES:
        assert rule.doc and "\n" not in rule.doc and rule.doc.endswith("."), f"{rule.key}: doc {rule.doc!r}"
        assert checks.type_text(rule.check) != "see the description" or rule.check is checks.DECLARED_ONLY, rule.key
        said = [
            way
            for way, said in (("required", rule.required), ("default", rule.has_default), ("left_out", rule.left_out))
            if said
        ]
        assert len(said) == 1, f"{rule.key}: says what a config without it means {said or 'nowhere'}"
    for target, args in targets.TARGET_ARGS.items():
        for name, (_, _, doc) in args.items():
            assert doc and doc.endswith("."), f"{target}({name}=...): doc {doc!r}"


# The values an option exists to give (a site profile's, a dataset's own validation node and loader settings, a
# logger option naming itself): every other shipped value of a key with a declared default restates that default.
OWN_VALUES = {
    "cluster/local.yaml": {"cluster.cpus_per_gpu"},
    "cluster/slurm.yaml": {"cluster.gpus_per_node", "cluster.cpus_per_gpu"},
    "cluster/jean_zay.yaml": {
        *(f"cluster.{k}" for k in ("partition", "constraint", "gpus_per_node", "cpus_per_gpu", "account_env")),
        "cluster.gpu_memory_gb",
        *(f"cluster.{k}" for k in ("account_suffix", "qos_by_time", "hint", "setup")),
    },
    "data/digits.yaml": {"data.val"},
    "data/synthetic.yaml": {"data.val"},
    "data/imagefolder.yaml": {"data.val", "data.num_workers", "data.pin_memory"},
    "logger/tensorboard.yaml": {"logger.name"},
    "container/apptainer.yaml": {"container.name", "container.image", "container.command"},
    "container/pyxis.yaml": {"container.name", "container.image"},
    "container/oci.yaml": {"container.name", "container.image"},
    "logger/wandb.yaml": {"logger.name", "logger.project"},
    "logger/mlflow.yaml": {"logger.name", "logger.experiment"},
}


@pytest.mark.parametrize("path", [CONF / "config.yaml", *OPTIONS], ids=lambda p: f"{p.parent.name}/{p.name}")
def test_each_shipped_value_of_a_key_with_a_declared_default_equals_it(path):
    """A default is written once, in its declaration: a YAML file that lists the key (so that `key=value` overrides
    it) restates the same value, unless the option exists to set it (OWN_VALUES)."""
    name = path.relative_to(CONF).as_posix()
    own = OWN_VALUES.get(name, set())
    for key, value, _ in _shipped_keys(path):
        rules = [rule for rule in _declarations(key) if rule.has_default]
        if not rules or key in own:
            continue
        assert value == rules[0].default, f"{name}: {key}={value!r} but its declaration says {rules[0].default!r}"
    for key in own:
        assert any(k == key for k, _, _ in _shipped_keys(path)), f"OWN_VALUES names {key}, which {name} does not set"


def test_the_declaration_says_what_null_means_for_the_readers_that_act_on_it():
    """strategy.chunks null (or absent: model_parallel) is one micro-batch, read through one function; the requeue
    signal is spelled one way, however it was written."""
    assert micro_batches(None) == 1 and micro_batches(4) == 4
    assert (
        strategy_table.split_settings(
            {"name": "model_parallel", "stages": None, "split_points": None, "balance": "params", "batchnorm": "keep"}
        ).chunks
        == 1
    )
    assert launcher.signal_name("sigusr1") == launcher.signal_name("USR1") == "USR1"
    (rule,) = _declarations("launcher.signal")
    assert rule.check("SIGUSR1") is None and rule.check("TERM") is not None


def test_every_declared_key_is_in_the_generated_reference_with_its_doc():
    spec = importlib.util.spec_from_file_location("reference_pages", REPO / "scripts" / "reference_pages.py")
    hook = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hook)
    page = hook.reference()
    for rule in config.RULES:
        assert f"| `{rule.key}` |" in page, rule.key
        assert hook.text(rule.doc) in page, rule.key


def test_a_config_that_leaves_keys_out_runs_with_the_declared_defaults():
    plain = {
        "strategy": {"name": "pipeline"},
        "trainer": {"batch_size": 8},
        "launcher": {"name": "local"},
        "data": {"train": {"_target_": "x.Y"}},
    }
    filled = engine.complete(plain)
    assert plain["strategy"]["chunks"] == 4 and plain["strategy"]["engine"] == "native"
    assert "replicate" not in plain["strategy"], "an fsdp key is not given to a pipeline"
    assert "schedule" not in plain["strategy"], "a pipelining key is not given to the native pipeline"
    assert plain["trainer"]["grad_accum_steps"] == 1 and plain["trainer"]["hang_timeout_s"] == "auto"
    assert plain["launcher"]["signal"] == "USR2" and plain["launcher"]["signal_delay_s"] == 120
    assert plain["launcher"]["wait"] is False
    assert plain["data"]["num_workers"] == 0 and plain["data"]["val"] is None
    assert "script" not in plain, "a section the config does not have is not invented"
    assert engine.complete(plain) == [] and "strategy.chunks" in filled
    assert set(filled) <= set(config.DEFAULTS)


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
    engine.complete(spec)
    assert spec["strategy"]["backend"] == "auto" and spec["data"]["num_workers"] == 0
    new = fingerprint.fingerprint(spec, 1)
    assert new != old and fingerprint.differences(old, new) == []
    spec["data"]["num_workers"] = 4  # a real change is still one
    assert fingerprint.differences(old, fingerprint.fingerprint(spec, 1)) == [
        "data.num_workers: checkpoint 0, this run 4"
    ]
