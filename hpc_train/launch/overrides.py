"""Check command-line overrides against conf/ before Hydra sees them.

Hydra's own errors for a mistyped option or key are several lines long and, for a key,
suggest adding it with ``+key=...``, which is the wrong fix for a typo. This check reads the
YAML files of conf/ (no composition, a few milliseconds) and raises one ConfigError naming
the key, what is wrong and the nearest valid spelling. It only refuses what is certainly
wrong; anything it cannot judge (``+``/``~`` overrides, Hydra's own keys, interpolated or
glob/range selections) is left to Hydra.
"""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Dict, List, Optional, Sequence

from omegaconf import DictConfig, OmegaConf

from hpc_train.launch.errors import ConfigError


def _options(conf_dir: Path, group: str) -> List[str]:
    return sorted(p.stem for p in (conf_dir / group).glob("*.yaml"))


def _nearest(word: str, choices: Sequence[str]) -> str:
    close = difflib.get_close_matches(word, list(choices), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _default_selections(conf_dir: Path) -> Dict[str, str]:
    primary = OmegaConf.load(conf_dir / "config.yaml")
    selections: Dict[str, str] = {}
    for entry in OmegaConf.to_container(primary, resolve=False).get("defaults", []):
        if isinstance(entry, dict):
            for key, value in entry.items():
                if not str(key).startswith(("override ", "hydra/")) and value is not None:
                    selections[str(key)] = str(value)
    return selections


def check_overrides(args: Sequence[str], conf_dir: Path) -> None:
    """Raise ConfigError for an override that cannot parse, an unknown group option, or an unknown key."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    plain = [a for a in args if not a.startswith("-")]
    if not plain:
        return
    parser = OverridesParser.create()
    parsed = []
    for arg in plain:
        try:
            parsed.append(parser.parse_override(arg))
        except HydraException:
            key = arg.split("=", 1)[0]
            raise ConfigError(
                key,
                f"the override {arg!r} cannot be parsed (an unbalanced quote, or a character such as '\"', ',' or a space that needs quoting).",
                f"quote the value as a whole, e.g. {key}='my value', or leave the special characters out.",
            ) from None
    groups = {p.name for p in conf_dir.iterdir() if p.is_dir() and not p.name.startswith("_")}
    selections: Dict[str, List[str]] = {group: [name] for group, name in _default_selections(conf_dir).items()}
    for override in parsed:
        name = override.key_or_group
        if override.is_add() or override.is_delete() or override.package or name not in groups:
            continue
        values = _choice_values(override)
        if values is None:
            selections.pop(name, None)  # glob/range/interpolation: let Hydra judge
            continue
        known = _options(conf_dir, name)
        for value in values:
            if value not in known:
                raise ConfigError(name, f"there is no {name} option {value!r}{_nearest(value, known)}.", f"use one of: {', '.join(known)} (files in conf/{name}/).")
        selections[name] = values
    _resolve_interpolated(selections)
    top = OmegaConf.load(conf_dir / "config.yaml")
    for override in parsed:
        key = override.key_or_group
        if override.is_add() or override.is_delete() or override.package or key.startswith("hydra.") or key in groups:
            continue
        head, _, rest = key.partition(".")
        if not rest:
            if head not in top.keys():
                choices = [k for k in top.keys() if k not in ("defaults", "hydra")] + sorted(groups)
                raise ConfigError(key, f"there is no top-level key {key!r}{_nearest(key, choices)}.", f"check the spelling; top-level keys are {', '.join(choices)} (add a new key with +{key}=...).")
            continue
        if head not in groups or head not in selections:
            continue
        for option in selections[head]:
            path = conf_dir / head / f"{option}.yaml"
            if not path.exists():
                continue
            node = _option_keys(conf_dir / head, option)
            if node is None:
                continue
            missing = _missing_part(node, rest.split("."))
            if missing is not None:
                parent, word, siblings = missing
                where = f"{head}.{parent}" if parent else head
                raise ConfigError(
                    key,
                    f"{where} ({head}={option}) has no key {word!r}{_nearest(word, siblings)}.",
                    f"use one of its keys: {', '.join(siblings)}; or add a new key on purpose with +{key}=...",
                )


def _choice_values(override) -> Optional[List[str]]:
    """The option names an override selects (several for a sweep), or None when not a plain list."""
    try:
        if override.is_sweep_override():
            if override.value_type is None or override.value_type.name not in ("CHOICE_SWEEP", "SIMPLE_CHOICE_SWEEP"):
                return None
            return [str(v) for v in override.sweep_string_iterator()]
        value = override.value()
    except Exception:
        return None
    if not isinstance(value, str) or "${" in value:
        return None
    return [value]


def _resolve_interpolated(selections: Dict[str, List[str]]) -> None:
    """`cluster: ${launcher}` in the defaults list: follow the launcher selection."""
    for group, values in list(selections.items()):
        resolved: List[str] = []
        for value in values:
            if value.startswith("${") and value.endswith("}"):
                target = value[2:-1]
                if target not in selections:
                    selections.pop(group)
                    break
                resolved.extend(selections[target])
            else:
                resolved.append(value)
        else:
            selections[group] = resolved


def _missing_part(node, parts: List[str]):
    """(parent path, missing key, keys there) for the first part of `parts` that `node` lacks; None if all exist."""
    walked: List[str] = []
    for part in parts:
        if not isinstance(node, DictConfig):
            return None  # a list index or a leaf: Hydra judges
        if part not in node.keys():  # `in node` is False for mandatory (???) values
            return ".".join(walked), part, sorted(str(k) for k in node.keys())
        node = node._get_node(part)
        walked.append(part)
    return None


def _option_keys(group_dir: Path, option: str, depth: int = 0) -> Optional[DictConfig]:
    """The option's YAML merged over the options its own defaults list extends (``- slurm``)."""
    path = group_dir / f"{option}.yaml"
    if depth > 5 or not path.exists():
        return None
    node = OmegaConf.load(path)
    if "defaults" not in node:
        return node
    merged = OmegaConf.create({})
    for entry in OmegaConf.to_container(node, resolve=False)["defaults"]:
        if entry == "_self_":
            continue
        if not isinstance(entry, str):
            return None  # a group or package entry: Hydra judges
        base = _option_keys(group_dir, entry, depth + 1)
        if base is None:
            return None
        merged = OmegaConf.merge(merged, base)
    own = OmegaConf.to_container(node, resolve=False)
    own.pop("defaults")
    return OmegaConf.merge(merged, own)
