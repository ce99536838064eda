"""hydra_errors' table of Hydra's composition messages (_COMPOSITION): each entry turns its message into the
ConfigError naming the key, and every entry is reached by some message of Hydra's."""

import pytest
from hydra.errors import ConfigCompositionException

from hpc_train.launch.hydra import hydra_errors
from hpc_train.launch.hydra.hydra_errors import translate

# Hydra's words for each kind, the key the ConfigError names, and a piece of its problem or fix.
SAMPLES = [
    ("Could not append to config. An item is already at 'trainer.lr'.", "trainer.lr", "drop the '+'"),
    ("model appears more than once in the final defaults list", "model", "adds a second model entry"),
    (
        "Ambiguous value for argument 'seed=1,2'\n1. To use it as a list, use key=[value1,value2]",
        "seed",
        "add -m (--multirun)",
    ),
    ("Could not delete from config. 'trainer.nope' does not exist.", "trainer.nope", "~trainer.nope deletes"),
    ("Error merging override +trainer=5", "trainer", "trainer=5 cannot be merged into the config (bad value)"),
    ("Could not override 'data'. No match in the defaults list.", "data", "add one with +data=<option>"),
]


def composition_error(text: str) -> ConfigCompositionException:
    err = ConfigCompositionException(text)
    err.__cause__ = ValueError("bad value\nmore")
    return err


@pytest.mark.parametrize("text, key, words", SAMPLES)
def test_each_composition_message_becomes_a_config_error_naming_its_key(text, key, words):
    translated = translate(composition_error(text))
    assert translated is not None and translated.key == key
    assert words in f"{translated.problem} {translated.fix}"


def test_every_entry_of_the_table_is_exercised_by_exactly_one_message():
    hits = [
        [pattern.pattern for pattern, _ in hydra_errors._COMPOSITION if pattern.search(text)][:1]
        for text, _, _ in SAMPLES
    ]
    assert sorted(p for hit in hits for p in hit) == sorted(pattern.pattern for pattern, _ in hydra_errors._COMPOSITION)


def test_a_message_the_table_does_not_know_is_not_translated():
    assert translate(composition_error("something else went wrong")) is None
    # the anchored entries only match where Hydra's message opens with their words
    assert translate(composition_error("see: Error merging override x=1")) is None


def test_a_merge_error_without_a_cause_says_the_value_does_not_fit():
    translated = translate(ConfigCompositionException("Error merging override trainer.lr=abc"))
    assert translated.key == "trainer.lr" and "the value does not fit the key" in translated.problem
