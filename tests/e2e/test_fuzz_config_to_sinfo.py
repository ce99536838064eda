"""The fuzz of every key's overrides (tests/unit/test_fuzz_config.py) carried through slurm.prepare for launcher=slurm:
a dry run that may ask sinfo once (a process), so these are not unit tests."""

from __future__ import annotations

import pytest
from hydra import initialize_config_dir
from hypothesis import given, settings
from hypothesis import strategies as st

from hpc_train.conf import CONFIG_DIR
from tests.unit.test_fuzz_config import (  # noqa: F401  (run_dir and targets: fixtures, found by name)
    ENV,
    FLOATS,
    INTS,
    LISTS,
    MAPPINGS,
    SCALE,
    SETTINGS,
    TEXT,
    _assert_clean,
    _env,
    _overrides,
    cli_outcome,
    names,
    run_dir,
    targets,
)

SCALARS = st.one_of(INTS, FLOATS, st.booleans(), st.none(), TEXT)


ANY_VALUE = st.one_of(SCALARS, LISTS, MAPPINGS)


@settings(max_examples=int(150 * SCALE), **SETTINGS)
@given(data=st.data())
def test_any_value_of_any_key_validates_or_is_refused_naming_a_key(data, targets, run_dir):  # noqa: F811 (fixtures)
    context, key, _default = data.draw(st.sampled_from(targets), label="key")
    value = data.draw(ANY_VALUE, label="value")
    overrides = _overrides(context, key, value)
    with _env(**ENV), initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        outcome = cli_outcome(overrides, run_dir)
    _assert_clean(outcome, overrides[-1])
    status, named, message = outcome
    if (
        status == "refused" and named is None
    ):  # Hydra's own words (e.g. a list merged into a mapping): they name the key
        assert key in message, f"{overrides[-1]}: {message}"


SLURM_TEXT_KEYS = [
    "job_name",
    "cluster.partition",
    "cluster.account",
    "cluster.qos",
    "cluster.constraint",
    "cluster.hint",
    "cluster.gpu_flag",
    "cluster.account_suffix",
    "cluster.extra",
]


@pytest.mark.parametrize("key", SLURM_TEXT_KEYS)
@pytest.mark.parametrize(
    "value",
    ["'gpu\u00e9'", "'\u4e2d\u6587'", "'two\nlines'", "'a b'", "'\U0001f600'"],
    ids=["accent", "cjk", "newline", "space", "emoji"],
)
def test_slurm_text_is_plain_ascii_on_one_line(key, value, run_dir):  # noqa: F811 (run_dir: a fixture)
    override = f"{key}={{x:{value}}}" if key == "cluster.extra" else f"{key}={value}"
    with _env(**ENV), initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        status, named, message = cli_outcome(["dry_run=true", "launcher=slurm", override], run_dir)
    if (
        key == "cluster.extra" and value == "'a b'"
    ):  # an option's value may hold spaces: the script quotes it (--comment='a b')
        assert status == "ok", f"{override}: {message}"
        return
    assert status == "refused" and named is not None and names(named, key), f"{override}: {status} {message}"
