"""Each job's config in a sweep, composed by Hydra once per set of config-group choices.

Hydra's full composition of one job costs ~0.1 s and a copy of a composed config (Hydra's own
node included) ~20 ms; a 10,000-job sweep cannot pay either per job. Jobs that differ only in
plain values (``seed=3``, ``trainer.lr=0.1``) share one composition (a *template*): the values
are set on it the way Hydra sets them (``OmegaConf.update(..., merge=True)``), the job's config
is read resolved (plain data, a fraction of a millisecond), and the template's values are put
back. Anything else (adding or deleting keys, packages, ``hydra.*``, a config group, a value
Hydra would refuse) goes through Hydra's full composition, so Hydra decides and words errors.
"""

from __future__ import annotations

import copy
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

from hydra.core.hydra_config import HydraConfig
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import DictConfig, ListConfig, OmegaConf, open_dict, read_write

from hpc_train.config.engine import check_changed, check_plain, checked_view, complete, resolved
from hpc_train.config.errors import ConfigError
from hpc_train.config.view import ConfigView, copy_plain
from hpc_train.launch.hydra import hydra_internals
from hpc_train.launch.planning.jobspec import hydra_choices

log = logging.getLogger(__name__)

_MISSING = object()


@dataclass
class _Template:
    config: DictConfig  # Hydra's composition for one set of group choices (hydra node included)
    hydra_config: Any  # what HydraConfig holds for it (set_config's masked copy), so `${hydra:...}` resolves
    choices: Dict[str, str]  # model=..., data=...: the job spec's `choices`
    plain: Optional[dict]  # its resolved values (None: something does not resolve)
    interpolations: List[Tuple[Tuple[Any, ...], str]]  # (path, text as written) of every interpolated value
    checked: bool  # `plain` passed every declared rule (hpc_train.config): a job re-checks only the keys it changed
    numbered: bool  # the run dir is <sweep dir>/<job number> and no value reads Hydra's node: no per-job Hydra state
    sweep_dir: Path


@dataclass
class JobConfig:
    """One sweep job's resolved config (checked key by key), its run dir and its config-group choices."""

    view: ConfigView
    run_dir: Path
    choices: Dict[str, str]


class SweepConfigs:
    def __init__(self, loader: Any, config: DictConfig) -> None:
        self._loader = loader
        self._config = config
        self._parser = OverridesParser.create()
        self._groups = set(loader.list_groups(""))
        self._templates: Dict[Tuple[str, ...], _Template] = {}
        self._parsed: Dict[str, Any] = {}  # override text -> Hydra's parse of it (the same texts recur in every job)
        self._structural: Dict[str, bool] = {}  # override text -> does it change the composition
        self._hydra_config = HydraConfig.instance()

    def _split(self, overrides: Sequence[str]) -> Tuple[List[Any], List[str], List[Any]]:
        """(all overrides parsed, those that change the composition, plain value overrides)."""
        missing = [o for o in overrides if o not in self._parsed]
        if missing:
            self._parsed.update(zip(missing, self._parser.parse_overrides(missing)))
        parsed = [self._parsed[o] for o in overrides]
        for text, o in zip(overrides, parsed):
            if text not in self._structural:
                self._structural[text] = (
                    o.is_add()
                    or o.is_delete()
                    or o.is_force_add()
                    or o.package is not None
                    or o.key_or_group.split(".")[0] in self._groups
                    or o.key_or_group.startswith("hydra")
                    or o.is_sweep_override()
                )
        kinds = [self._structural[text] for text in overrides]
        return (
            parsed,
            [o.input_line for o, structural in zip(parsed, kinds) if structural],
            [o for o, structural in zip(parsed, kinds) if not structural],
        )

    def full(self, overrides: Sequence[str], idx: int) -> DictConfig:
        """The job's whole config (a DictConfig of its own): for jobs Hydra runs itself (local ones)."""
        parsed, base, values = self._split(overrides)
        template = self._template(tuple(base))
        try:
            config = copy.deepcopy(template.config)
            OmegaConf.set_readonly(config.hydra, None)  # HydraConfig.set_config made the template's read-only
            for o in values:
                if OmegaConf.select(config, o.key_or_group, default=_MISSING) is _MISSING:
                    raise KeyError(o.key_or_group)
                OmegaConf.update(config, o.key_or_group, o.value(), merge=True)
        except Exception as err:  # let Hydra compose it and report the problem in its own words
            log.debug("full composition for %s: %r", list(overrides), err)
            config = self._loader.load_sweep_config(self._config, list(overrides))
        with open_dict(config):
            _identify(config.hydra, overrides, parsed, idx)
            # what Hydra's run_job writes as the job's .hydra/overrides.yaml: all of its own, its swept values too
            config.hydra.overrides.task = [o.input_line for o in parsed if not o.is_hydra_override()]
        return config

    def resolved(self, overrides: Sequence[str], idx: int) -> JobConfig:
        """The job's config resolved and checked key by key (ConfigError naming the key), without a copy of its own."""
        parsed, base, values = self._split(overrides)
        template = self._template(tuple(base))
        saved = self._set(template, values, idx)
        if saved is None:  # a value Hydra must look at itself: compose this job in full
            config = self.full(overrides, idx)
            self._hydra_config.set_config(config)
            return JobConfig(checked_view(config), _run_dir(config), hydra_choices())
        if not template.numbered:
            for node in (template.config.hydra, template.hydra_config.hydra):
                with read_write(node):
                    _identify(node, overrides, parsed, idx)
        try:
            plain, changed = _updated(template, [o.key_or_group for o in values])
            if plain is None:
                plain = resolved(template.config)
            if plain is None:
                checked_view(template.config)  # names the value that does not resolve
            if template.checked and changed is not None:
                check_changed(plain, changed)
            else:
                check_plain(plain)
            complete(plain)
            run_dir = template.sweep_dir / str(idx) if template.numbered else _run_dir(template.config)
            return JobConfig(ConfigView(plain), run_dir, template.choices)
        finally:
            self._restore(template, saved)

    def _template(self, base: Tuple[str, ...]) -> _Template:
        template = self._templates.get(base)
        if template is None:
            config = self._loader.load_sweep_config(self._config, list(base))
            self._hydra_config.set_config(config)
            plain = resolved(config)
            interpolations = list(_interpolations(config))
            sweep = config.hydra.sweep
            numbered = sweep._get_node("subdir")._value() == "${hydra.job.num}" and not any(
                "hydra" in text for _, text in interpolations
            )
            template = _Template(
                config,
                self._hydra_config.cfg,
                hydra_choices(),
                plain,
                interpolations,
                checked=plain is not None and _passes(plain),
                numbered=numbered,
                sweep_dir=Path(str(sweep.dir)),
            )
            self._templates[base] = template
        if self._hydra_config.cfg is not template.hydra_config:
            self._hydra_config.cfg = template.hydra_config
        return template

    def _set(self, template: _Template, values: List[Any], idx: int) -> Optional[List[Tuple[str, Any]]]:
        """Set the job's values and number on the template; what to put back, or None (nothing changed) when a value
        cannot be set this way."""
        config = template.config
        saved: List[Tuple[str, Any]] = []
        try:
            for o in values:
                key = o.key_or_group
                old = OmegaConf.select(config, key, default=_MISSING, throw_on_resolution_failure=False)
                if old is _MISSING:
                    raise KeyError(key)
                saved.append((key, _raw(config, key)))
                OmegaConf.update(config, key, o.value(), merge=True)
        except Exception as err:
            log.debug("full composition for %s: %r", [o.input_line for o in values], err)
            self._restore(template, saved)
            return None
        return saved

    @staticmethod
    def _restore(template: _Template, saved: List[Tuple[str, Any]]) -> None:
        for key, raw in reversed(saved):
            OmegaConf.update(template.config, key, raw, merge=False)


def _raw(config: DictConfig, key: str) -> Any:
    """The value at `key` as written (interpolations unresolved), to set back later."""
    parent_key, _, leaf = key.rpartition(".")
    parent = OmegaConf.select(config, parent_key) if parent_key else config
    node = parent._get_node(leaf)
    if isinstance(node, (DictConfig,)) or OmegaConf.is_list(node):
        return OmegaConf.to_container(node, resolve=False)
    return node._value()


def _identify(hydra: Any, overrides: Sequence[str], parsed: List[Any], idx: int) -> None:
    """What Hydra sets per job on its node: number, id and the override dir name."""
    hydra.job.id = idx
    hydra.job.num = idx
    dirname = hydra.job.config.override_dirname
    hydra.job.override_dirname = hydra_internals.overrides_dirname(
        overrides=[o for o in parsed if not o.key_or_group.startswith("hydra")],
        exclude_keys=list(dirname.exclude_keys),
        item_sep=dirname.item_sep,
        kv_sep=dirname.kv_sep,
    )
    # ${hydra:runtime.output_dir} in a job's values (a script's --out_dir=...) names that job's own run dir, as
    # Hydra sets it when it runs a job itself.
    hydra.runtime.output_dir = os.path.abspath(str(Path(str(hydra.sweep.dir)) / str(hydra.sweep.subdir)))


def _run_dir(config: DictConfig) -> Path:
    return Path(str(config.hydra.sweep.dir)) / str(config.hydra.sweep.subdir)


def _passes(plain: dict) -> bool:
    """The composition passes every rule (else each job is checked in full: its values may be what fixes it)."""
    try:
        check_plain(plain)
    except ConfigError:
        return False
    return True


def _interpolations(config: DictConfig) -> Iterator[Tuple[Tuple[Any, ...], str]]:
    """(path, text) of every interpolated value outside Hydra's node."""

    def walk(node: Any, path: Tuple[Any, ...]) -> Iterator[Tuple[Tuple[Any, ...], str]]:
        keys = node.keys() if isinstance(node, DictConfig) else range(len(node))
        for key in keys:
            if not path and key == "hydra":
                continue
            child = node._get_node(key)
            if child._is_interpolation():
                yield (*path, key), str(child._value())
            elif isinstance(child, (DictConfig, ListConfig)) and not child._is_none() and not child._is_missing():
                yield from walk(child, (*path, key))

    yield from walk(config, ())


def _updated(template: _Template, changed: List[str]) -> Tuple[Optional[dict], Optional[List[Tuple[Any, ...]]]]:
    """The template's resolved values with the job's changed keys, and every interpolation that may read them, resolved
    again, and the paths of those keys; (None, None) when that cannot be done this way (the caller resolves the whole
    config).

    An interpolation is read again when its text names any part of a changed key (`${trainer}`
    for trainer.lr, `${.lr}`, `${oc.select:trainer.lr}`) or Hydra's node (job numbers), and so
    on for interpolations of those: an over-approximation, never a miss for interpolations that
    name what they read.
    """
    if template.plain is None:
        return None, None
    words = {part for key in changed for part in key.split(".")} | {"hydra"}
    dirty: List[Tuple[Any, ...]] = [tuple(key.split(".")) for key in changed]
    pending = list(template.interpolations)
    grew = True
    while grew:
        grew = False
        for item in list(pending):
            path, text = item
            if any(word in text for word in words):
                pending.remove(item)
                dirty.append(path)
                words.update(str(part) for part in path)
                grew = True
    plain = copy_plain(template.plain)
    try:
        for path in dirty:
            _put(plain, path, _value_at(template.config, path))
    except Exception as err:  # noqa: BLE001 - anything odd: resolve the whole config instead
        log.debug("resolving %s in full: %r", changed, err)
        return None, None
    return plain, dirty


def _value_at(config: DictConfig, path: Tuple[Any, ...]) -> Any:
    node: Any = config
    for part in path[:-1]:
        node = node[part]
    value = node[path[-1]]
    if isinstance(value, (DictConfig, ListConfig)):
        return OmegaConf.to_container(value, resolve=True)
    return value


def _put(plain: Any, path: Tuple[Any, ...], value: Any) -> None:
    node = plain
    for part in path[:-1]:
        node = node[part]
    node[path[-1]] = value
