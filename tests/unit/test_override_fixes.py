"""A refused override's fix is a command line the user pastes into a shell: the message names the character Hydra
could not read, and the override it suggests reaches Hydra, through the shell's quote removal, as the value the user
meant (each fix split as a POSIX shell splits it, then parsed by Hydra's own override parser)."""

import shlex

import pytest
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import ConfigCompositionException, OverrideParseException

from hpc_train.launch.hydra.hydra_errors import translate

PARSER = OverridesParser.create()


def refusal(override: str):
    """The ConfigError hpc-train prints for `override`, from the exception Hydra's parser really raises."""
    with pytest.raises(OverrideParseException) as raised:
        PARSER.parse_overrides([override])
    return translate(raised.value)


def pasted(fix: str, key: str):
    """What Hydra reads of the fix's override for `key`, once the shell has split and unquoted the fix."""
    words = [word for word in shlex.split(fix) if word.startswith(f"{key}=")]
    assert words, fix
    return PARSER.parse_override(words[0].rstrip(".;")).value()


@pytest.mark.parametrize(
    "key, value, found",
    [
        ("container.image", "nvcr.io#nvidia/pytorch:24.05-py3", "#"),
        ("job_name", 'a"b', '"'),
        ("cluster.setup", "x;y", ";"),
        ("job_name", "x&y", "&"),
        ("job_name", "x{y", "{"),
        ("job_name", "x(y", "("),
        ("script.objective_regex", "val loss ([0-9.]+)", "("),
        ("job_name", "it's", "'"),
        ("data.root", "/data/$USER/a!b", "!"),
    ],
)
def test_an_unparsable_override_names_its_character_and_the_fix_survives_the_shell(key, value, found):
    err = refusal(f"{key}={value}")
    assert err is not None and err.key == key
    assert f"the character {found!r} needs quoting" in err.problem or f"an unbalanced quote ({found!r})" in err.problem
    assert "such as" not in err.problem, err.problem
    assert pasted(err.fix, key) == value, err.fix


def test_the_pyxis_image_fix_is_the_guides_command():
    err = refusal("container.image=nvcr.io#nvidia/pytorch:24.05-py3")
    assert "\"container.image='nvcr.io#nvidia/pytorch:24.05-py3'\"" in err.fix, err.fix


@pytest.mark.parametrize("key, value", [("seed", "1,2"), ("data.root", "C:\\a,b\\"), ("job_name", "x,$HOME!")])
def test_a_comma_without_multirun_suggests_a_quoted_value_that_survives_the_shell(key, value):
    err = translate(ConfigCompositionException(f"Ambiguous value for argument '{key}={value}'\n1. To use it as a list"))
    assert err is not None and err.key == key
    assert pasted(err.fix, key) == value, err.fix
