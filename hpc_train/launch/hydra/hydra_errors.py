"""Turn Hydra's and OmegaConf's errors into hpc-train's one-paragraph ConfigError.

Hydra parses the command line and composes the config over the real search path (the
shipped conf/, ``--config-dir``, ``--config-path``, ``hydra.searchpath``, installed plugins);
we never guess ahead of it. When it fails, its exception already carries what the message
needs (the missing option and the group's options, the key and its parent node, the
override that did not parse); this module only rewords it: the key, what is wrong, the
nearest spelling, the fix. Nothing here runs on the success path.
"""

from __future__ import annotations

import difflib
import re
import shlex
from pathlib import Path
from typing import Callable, Iterable, Optional, Sequence, Tuple

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import ConfigCompositionException, MissingConfigException, OverrideParseException, SearchPathException
from omegaconf import OmegaConf
from omegaconf.errors import (
    ConfigAttributeError,
    ConfigKeyError,
    InterpolationResolutionError,
    MissingMandatoryValue,
    OmegaConfBaseException,
)

from hpc_train.conf import CONFIG_DIR
from hpc_train.config import MAPPING_KEYS
from hpc_train.config.errors import ConfigError
from hpc_train.launch.hydra import hydra_internals


def nearest(word: str, choices: Iterable[str]) -> str:
    """`` (did you mean 'x'?)`` for the closest choice, or an empty string."""
    close = difflib.get_close_matches(word, [str(c) for c in choices], n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def translate(err: BaseException, argv: Sequence[str] = ()) -> Optional[ConfigError]:
    """The ConfigError for a Hydra or OmegaConf exception, or None when it is none of the known kinds.

    `argv` (the command line's arguments) is read, with Hydra's own override parser, only for
    the few errors whose message does not name the override that caused them.
    """
    if isinstance(err, ConfigError):
        return err
    if isinstance(err, OverrideParseException):
        return _unparsable(err.override, str(err))
    if isinstance(err, MissingConfigException):
        return _missing_option(err)
    if isinstance(err, SearchPathException):
        return ConfigError(
            "--config-dir",
            f"{_first_line(err)}.",
            "pass an existing folder: --config-dir /path/to/my_conf (it holds e.g. cluster/mysite.yaml).",
        )
    if isinstance(err, ConfigCompositionException):
        return _composition(err)
    if isinstance(err, OmegaConfBaseException):
        return from_omegaconf(err)
    if isinstance(err, ValueError) and _innermost_frame(err) == hydra_internals.FLAG_CHECK_FRAME:
        return _flag_misuse(err, argv)
    if isinstance(err, (ValueError, TypeError)) and _raised_by_hydra(err):
        return _bad_group_value(argv)
    if isinstance(err, OSError) and err.filename:  # Hydra could not create the run dir
        return ConfigError(
            "hydra.run.dir",
            f"the output directory cannot be created: {err.filename}: {err.strerror or err}.",
            "pass hydra.run.dir=/a/writable/path (hydra.sweep.dir=... for -m), e.g. on $SCRATCH or $WORK.",
        )
    return None


def from_omegaconf(err: BaseException) -> Optional[ConfigError]:
    """A key our checks read that is missing, unset (``???``) or cannot be resolved."""
    key = str(getattr(err, "full_key", "") or "")
    if isinstance(err, MissingMandatoryValue):
        return ConfigError(
            key,
            "has no value (it is `???` in the config) and this run needs one.",
            f"pass {key}=<value> on the command line or in your config.",
        )
    if isinstance(err, InterpolationResolutionError):
        return ConfigError(
            key,
            f"cannot be resolved: {_first_line(err)}.",
            "check the keys it refers to (print the config with --cfg job).",
        )
    if isinstance(err, (ConfigAttributeError, ConfigKeyError)) and key:
        missing = str(getattr(err, "key", "") or key.rsplit(".", 1)[-1])
        parent = key.rsplit(".", 1)[0] if "." in key else ""
        whole = f"{parent}.{missing}" if parent else missing
        return ConfigError(
            whole,
            f"is required but the config has no `{whole}` (was it deleted with ~{whole}, or left out of your own config"
            " file?).",
            f"give it a value: drop the ~{whole} override, or pass +{whole}=<value>.",
        )
    return None


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0].rstrip(".") if text else type(err).__name__


def _unparsable(override: str, message: str = "") -> ConfigError:
    key, _, value = str(override).partition("=")
    key = key.lstrip("+~") or str(override)
    found = _refused_character(str(override), message)
    what = "an unbalanced quote or bracket, or a character that needs quoting"
    if found is not None:
        what = f"it has an unbalanced quote ({found!r})" if found in "'\"" else f"the character {found!r} needs quoting"
    return ConfigError(
        key,
        f"the override {override!r} cannot be parsed: {what}.",
        f"quote the value for Hydra inside quotes for the shell, as in {pasteable(key, value)} (the shell removes the"
        " outer quotes, Hydra reads the inner ones), or leave the special characters out.",
    )


_LEXER_ERROR = "LexerNoViableAltException: "


def _refused_character(override: str, message: str) -> Optional[str]:
    """The character Hydra's parser stopped at: its lexer marks it with a caret under the override (the line above
    opens with the exception's name); its parser names it as 'mismatched' or 'extraneous' input, or the first
    bracket of the input it found no way to read."""
    lines = message.splitlines()
    if len(lines) >= 2 and lines[0].startswith(_LEXER_ERROR) and "^" in lines[1]:
        at = lines[1].index("^") - len(_LEXER_ERROR)
        return override[at] if 0 <= at < len(override) else None
    named = re.search(r"(?:mismatched|extraneous) input '\s*(\S)", message)
    if named:
        return named.group(1)
    token = re.search(r"no viable alternative at input '([^']*)'", message)
    brackets = [c for c in token.group(1) if c in "()[]{}"] if token else []
    return brackets[0] if brackets else None


def pasteable(key: str, value: str) -> str:
    """`key=value` as a user pastes it into a POSIX shell so that Hydra reads `value` as one string: quoted for Hydra
    (single quotes; a backslash doubled only before a quote or at the end, Hydra's rule), then for the shell (double
    quotes, their special characters escaped; single quotes where a '!' would start bash's history expansion)."""
    hydra = re.sub(r"(\\*)('|$)", lambda m: m.group(1) * 2 + ("\\'" if m.group(2) else ""), value)
    override = f"{key}='{hydra}'"
    if "!" in override:
        return shlex.quote(override)
    return '"' + re.sub(r'([\\"$`])', r"\\\1", override) + '"'


def _missing_option(err) -> ConfigError:
    missing = str(err.missing_cfg_file or "")
    options = sorted(str(o) for o in err.options or [])
    if "/" not in missing:  # the primary config itself (--config-name, --config-path)
        return ConfigError(
            "--config-name",
            f"there is no primary config {missing!r} in the config search path.",
            "check --config-name/--config-path (the default is hpc-train's own `config`), or add the file to your"
            " --config-dir.",
        )
    group, option = missing.rsplit("/", 1)
    where = re.match(r"In '([^']+)':", str(err))
    inside = (
        f" (named in the defaults list of {where.group(1)})"
        if where and where.group(1) != "config" and not where.group(1).startswith("hydra/")
        else ""
    )
    plugin = (
        " If it is a Hydra plugin, install it into this environment (e.g. pip install --no-deps hydra-optuna-sweeper,"
        " beside optuna>=4.0: the plugin declares optuna<3 but runs on Optuna 5)."
        if group.startswith("hydra/")
        else ""
    )
    listed = ", ".join(options) if options else "none"
    return ConfigError(
        group,
        f"there is no {group} option {option!r}{inside}{nearest(option, options)}.",
        f"use one of: {listed} (files {group}/<option>.yaml in conf/ or in your --config-dir).{plugin}",
    )


def _added_twice(match: "re.Match[str]", cause: Optional[BaseException]) -> ConfigError:
    key = match.group(1)
    return ConfigError(
        key,
        f"+{key}=... adds a new key, but `{key}` already exists.",
        f"drop the '+': {key}=<value> (or ++{key}=<value> to add or override).",
    )


def _group_twice(match: "re.Match[str]", cause: Optional[BaseException]) -> ConfigError:
    group = match.group(1)
    return ConfigError(
        group,
        f"+{group}=... adds a second {group} entry, but the config already selects one.",
        f"select it without '+': {group}=<option>.",
    )


def _comma_without_multirun(match: "re.Match[str]", cause: Optional[BaseException]) -> ConfigError:
    override = match.group(1)
    key, _, value = override.partition("=")
    return ConfigError(
        key,
        f"{override!r} has a comma, which makes it a sweep over several values.",
        f"add -m (--multirun) to run one job per value; or quote the value as one string: {pasteable(key, value)};"
        f" or make it a list: {key}=[{value}].",
    )


def _delete_missing(match: "re.Match[str]", cause: Optional[BaseException]) -> ConfigError:
    key = match.group(1)
    return ConfigError(
        key,
        f"~{key} deletes a key that the config does not have.",
        f"check the spelling (print the config with --cfg job), or drop ~{key}.",
    )


def _merge_failed(match: "re.Match[str]", cause: Optional[BaseException]) -> ConfigError:
    key, value = match.group(1).lstrip("+~"), match.group(2)
    reason = _first_line(cause) if cause is not None else "the value does not fit the key"
    return ConfigError(
        key,
        f"{key}={value} cannot be merged into the config ({reason}).",
        f"give {key} a value of the kind it holds (hpc-train --cfg job -p {key} shows it), or set one of its keys,"
        f" e.g. {key}.<key>=<value>.",
    )


def _nothing_to_override(match: "re.Match[str]", cause: Optional[BaseException]) -> ConfigError:
    group = match.group(1)
    return ConfigError(
        group,
        f"the config does not select any {group} option, so there is nothing to override.",
        f"add one with +{group}=<option>.",
    )


# Hydra's composition errors that its message alone names: (its words, searched in the message; '^' where they
# open it) -> the ConfigError, from the match and the error's cause. The first that matches decides.
_Build = Callable[["re.Match[str]", Optional[BaseException]], ConfigError]
_COMPOSITION: Tuple[Tuple["re.Pattern[str]", _Build], ...] = (
    (re.compile(r"An item is already at '([^']+)'"), _added_twice),
    (re.compile(r"^(\S+) appears more than once in the final defaults list"), _group_twice),
    (re.compile(r"Ambiguous value for argument '([^']+)'"), _comma_without_multirun),
    (re.compile(r"Could not delete from config\. '([^']+)' does not exist"), _delete_missing),
    (re.compile(r"^Error merging override ([^=\s]+)=(.*)"), _merge_failed),
    (re.compile(r"^Could not override '([^']+)'\. No match in the defaults list"), _nothing_to_override),
)


def _composition(err) -> Optional[ConfigError]:
    text = str(err)
    cause = err.__cause__
    if isinstance(cause, (ConfigAttributeError, ConfigKeyError)) and getattr(cause, "full_key", None):
        return _unknown_key(cause)
    for pattern, build in _COMPOSITION:
        match = pattern.search(text)
        if match:
            return build(match, cause)
    return None


def _unknown_key(cause) -> ConfigError:
    full_key = str(cause.full_key)
    word = str(cause.key)
    parent_node = getattr(cause, "parent_node", None)
    siblings = sorted(str(k) for k in parent_node.keys()) if parent_node is not None else []
    if "." not in full_key:
        choices = [k for k in siblings if k != "hydra"]
        return ConfigError(
            full_key,
            f"there is no top-level key {full_key!r}{nearest(full_key, choices)}.",
            f"check the spelling; top-level keys are {', '.join(choices)} (add a new key on purpose with"
            f" +{full_key}=...).",
        )
    parent = full_key.rsplit(".", 1)[0]
    if not siblings:  # a null (or empty) node, such as trainer.step before it is set
        whole = f"give the whole node, e.g. '{parent}={{{word}:...}}', or " if parent in MAPPING_KEYS else ""
        return ConfigError(
            full_key,
            f"{parent} is empty (null or {{}}), so it has no key {word!r}.",
            f"{whole}add the key on purpose with +{full_key}=...",
        )
    return ConfigError(
        full_key,
        f"{parent} has no key {word!r}{nearest(word, siblings)}.",
        f"use one of its keys: {', '.join(siblings)}; or add a new key on purpose with +{full_key}=...",
    )


def _innermost_frame(err: BaseException) -> Tuple[str, str]:
    """(module, function) of the frame that raised `err`."""
    tb = err.__traceback__
    if tb is None:
        return "", ""
    while tb.tb_next is not None:
        tb = tb.tb_next
    return tb.tb_frame.f_globals.get("__name__", ""), tb.tb_frame.f_code.co_name


def _raised_by_hydra(err: BaseException) -> bool:
    """A plain ValueError/TypeError from inside Hydra's composition (not from our code)."""
    module, _ = _innermost_frame(err)
    return module.startswith("hydra.") or module.startswith("omegaconf.")


def _flag_misuse(err: BaseException, argv: Sequence[str]) -> ConfigError:
    """Hydra's own check of its flags (--resolve without --cfg; two of --cfg, --info, -m, ...), which a plain
    Hydra app reports with a traceback. The key: the flags given, as Hydra's own argument parser reads argv."""
    args, _ = hydra_internals.args_parser().parse_known_args(list(argv))
    given = [
        flag
        for flag, on in (
            ("--cfg", args.cfg is not None),
            ("--info", args.info is not None),
            ("--multirun", args.multirun),
            ("--shell-completion", args.shell_completion),
            ("--resolve", args.resolve),
        )
        if on
    ]
    return ConfigError(
        " with ".join(given) or "Hydra's flags",
        f"{_first_line(err)}.",
        "give at most one of --cfg, --info, -m/--multirun and --shell-completion per command, and --resolve only with"
        " --cfg or --help, e.g. hpc-train --cfg job --resolve (hpc-train --hydra-help lists Hydra's flags).",
    )


def _bad_group_value(argv: Sequence[str]) -> Optional[ConfigError]:
    """A config-group choice that is not a name (model=5, model=null, trainer=[1]), found with Hydra's parser."""
    parser = OverridesParser.create()
    for arg in argv:
        if arg.startswith("-") or "=" not in arg:
            continue
        try:
            override = parser.parse_override(arg)
            value = override.value()
        except Exception:
            continue
        key = override.key_or_group
        if "." in key or override.is_delete() or key in _plain_top_level_keys():
            continue
        names = value if isinstance(value, list) else [value]
        if not all(isinstance(v, str) for v in names):
            return ConfigError(
                key,
                f"{arg!r} selects a {key} option by a value that is not a name.",
                f"name an option, e.g. {key}=<name> for {key}/<name>.yaml in conf/ or your --config-dir (hpc-train"
                " --help lists them).",
            )
    return None


def _plain_top_level_keys() -> Iterable[str]:
    """Top-level keys of the shipped config that are values, not config groups (seed, dry_run, ...)."""
    primary = OmegaConf.load(Path(CONFIG_DIR) / "config.yaml")
    return [str(k) for k in primary.keys() if k not in ("defaults", "hydra")]
