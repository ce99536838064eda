"""The engine that applies the declarations to a composed config: type and range of every key, defaults filled in.

``validate.check_keys`` and the sweep's per-job checks call it before any layout is computed,
so a wrong type never reaches code that would trip over it. How it reads a config:

* A key is checked when the config has it (a user's own option may leave optional keys out);
  the ``required`` ones must be there. ``*`` in a key matches every child of that node.
* Values are read resolved: a value interpolated from another key is checked where it is
  defined first (the table lists sources before the keys that interpolate them), and an
  interpolation that cannot be resolved is refused naming its key.
* The arguments of the shipped ``_target_`` s are checked here too (``targets.TARGET_ARGS``), and every
  ``_target_`` under ``hpc_train.`` must name something there (``targets.missing_target``, read from the source).

Cross-key rules (the batch splits over the ranks, stages fit the GPUs, ...) stay in
``launch/validate.py``. The login side only: it reads OmegaConf's containers.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Iterator, List, Optional, Sequence, Tuple

from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import InterpolationToMissingValueError, OmegaConfBaseException

from hpc_train.config.checks import show
from hpc_train.config.errors import ConfigError
from hpc_train.config.rule import Rule
from hpc_train.config.strategy import strategy_id
from hpc_train.config.table import MAPPING_KEYS, RULES
from hpc_train.config.targets import PUBLIC_TARGETS, TARGET_ARGS, TARGET_NODES, missing_target, public_name
from hpc_train.config.view import MISSING_TEXT, ConfigView, copy_plain

# -- reading the config ------------------------------------------------------------------------
# The checks read a plain, resolved copy of the config (one OmegaConf pass, a few ms); only when
# something does not resolve do they read the DictConfig itself, key by key, to name it.
_MISSING = object()  # `???`


def _first_line(err: BaseException) -> str:
    text_ = str(err).strip()
    return text_.splitlines()[0].rstrip(".") if text_ else type(err).__name__


def _unresolvable(key: str, err: BaseException) -> ConfigError:
    if isinstance(err, InterpolationToMissingValueError):
        return ConfigError(
            key,
            f"refers to a key that has no value (`???`): {_first_line(err)}.",
            "give that key a value (hpc-train --cfg job prints the config).",
        )
    return ConfigError(
        key,
        f"cannot be resolved: {_first_line(err)}.",
        "check the keys it refers to (hpc-train --cfg job prints the config).",
    )


def _is_map(node: Any) -> bool:
    return type(node) is dict or isinstance(node, Mapping)  # plain dicts first: ABC checks are slow in a big sweep


def _child(node: Any, name: Any, key: str) -> Any:
    """node[name], resolved; _MISSING for `???`; an interpolation that cannot be resolved is refused naming `key`."""
    if type(node) is dict:
        value = node[name]
        return _MISSING if value == MISSING_TEXT and isinstance(value, str) else value
    if isinstance(node, (DictConfig, ListConfig)):
        if OmegaConf.is_missing(node, name):
            return _MISSING
        try:
            return node[name]
        except OmegaConfBaseException as err:
            raise _unresolvable(key, err) from None
    value = node[name]
    return _MISSING if isinstance(value, str) and value == MISSING_TEXT else value


def _has(node: Any, name: str) -> bool:
    if type(node) is dict:
        return name in node
    return isinstance(node, Mapping) and name in node.keys()


def lookup(cfg: Any, pattern: str) -> Iterator[Tuple[str, Any]]:
    """(key, resolved value or _MISSING) for every key the dotted pattern names that the config has."""

    def walk(node: Any, parts: Sequence[str], prefix: str) -> Iterator[Tuple[str, Any]]:
        head, rest = parts[0], parts[1:]
        names = [str(k) for k in node.keys()] if head == "*" and _is_map(node) else [head]
        for name in names:
            if not _has(node, name):
                continue
            key = f"{prefix}.{name}" if prefix else name
            value = _child(node, name, key)
            if not rest:
                yield key, value
            elif _is_map(value):
                yield from walk(value, rest, key)

    return walk(cfg, pattern.split("."), "")


def _apply(key: str, value: Any, rule: Rule) -> None:
    if value is _MISSING:
        raise ConfigError(
            key,
            "has no value (it is `???` in the config) and this run needs one.",
            rule.fix_for(key).replace("set e.g.", "pass", 1),
        )
    if value is None and rule.null is not None:
        return
    try:
        problem = rule.check(value)
    except OmegaConfBaseException as err:  # an interpolation inside a list or mapping value
        raise _unresolvable(key, err) from None
    if problem:
        raise ConfigError(key, f"{problem}.", rule.fix_for(key))


def check_profile_type(cfg: Any) -> None:
    """Profiles with a per-GPU-type table (jean_zay): gpu_type must be one of its types, before anything reads them."""
    cluster = _child(cfg, "cluster", "cluster") if _has(cfg, "cluster") else None
    if not (_has(cluster, "gpu_type") and _has(cluster, "types")):
        return
    types = _child(cluster, "types", "cluster.types")
    gpu_type = _child(cluster, "gpu_type", "cluster.gpu_type")
    if not isinstance(types, Mapping) or not len(types):
        raise ConfigError(
            "cluster.types",
            f"must map each GPU type to its partition, constraint, gpus_per_node and cpus_per_gpu, got {show(types)}.",
            "keep the profile's types table (see conf/cluster/jean_zay.yaml).",
        )
    known = [str(k) for k in types.keys()]
    for name in known:
        entry = _child(types, name, f"cluster.types.{name}")
        if not isinstance(entry, Mapping):
            raise ConfigError(
                f"cluster.types.{name}",
                "must be a mapping such as {partition: gpu_p13, constraint: v100-32g, gpus_per_node: 4, cpus_per_gpu:"
                f" 10}}, got {show(entry)}.",
                "keep the profile's types table (see conf/cluster/jean_zay.yaml).",
            )
    if not isinstance(gpu_type, str) or gpu_type not in known:
        name = (
            cluster.get("name", "cluster")
            if not isinstance(cluster, DictConfig)
            else OmegaConf.select(cluster, "name", default="cluster", throw_on_resolution_failure=False)
        )
        raise ConfigError(
            "cluster.gpu_type",
            f"{show(gpu_type)} is not a GPU type of the {name} profile, which knows {', '.join(known)}.",
            f"use one of: {', '.join(f'cluster.gpu_type={t}' for t in known)}.",
        )


def check_table(cfg: Any) -> None:
    """Every key of RULES that the config has (and every required one) has the type and range it must."""
    for rule in RULES:
        found = False
        for key, value in lookup(cfg, rule.key):
            found = True
            _apply(key, value, rule)
        if rule.required and not found:
            raise ConfigError(
                rule.key,
                f"is required but the config has no `{rule.key}` (was it deleted with ~{rule.key}, or left out of your"
                " own config file?).",
                f"give it a value: drop the ~{rule.key} override, or pass +{rule.key}={rule.example}.",
            )


def check_target_args(cfg: Any) -> None:
    """The arguments of the shipped _target_s the model and data nodes name."""
    for node_key in TARGET_NODES:
        for _, node in lookup(cfg, node_key):
            target = node.get("_target_") if isinstance(node, Mapping) else None
            for arg, (check, example, _) in TARGET_ARGS.get(public_name(str(target)), {}).items():
                rule = Rule(f"{node_key}.{arg}", check, str(example))
                for key, value in lookup(cfg, rule.key):
                    _apply(key, value, rule)


def check_target_paths(node: Any, prefix: str = "") -> None:
    """Every `_target_` under hpc_train. in a resolved config (plain data) names a class or function there: a
    misspelt or moved one is refused here, before anything is queued, not at the first rank's import."""
    if isinstance(node, Mapping):
        for name, value in node.items():
            key = f"{prefix}.{name}" if prefix else str(name)
            if name == "_target_" and isinstance(value, str):
                _check_target_path(key, value)
            else:
                check_target_paths(value, key)
    elif isinstance(node, list):
        for index, value in enumerate(node):
            check_target_paths(value, f"{prefix}[{index}]")


def _check_target_path(key: str, target: str) -> None:
    missing = missing_target(target)
    if missing is None:
        return
    problem, close = missing
    public = ", ".join(PUBLIC_TARGETS)
    fix = f"did you mean {key}={close}? " if close else ""
    raise ConfigError(
        key,
        f"{show(target)} names nothing in hpc_train ({problem}).",
        f"{fix}hpc_train's public names are {public}; or name your own class or function (my_package.MyClass).",
    )


def check_resolvable(node: Any, prefix: str = "") -> None:
    """Every value of a DictConfig resolves (the job spec is the config resolved): the first that does not is named."""
    if isinstance(node, DictConfig):
        for name in node.keys():
            if not (prefix == "" and name == "hydra"):
                key = f"{prefix}.{name}" if prefix else str(name)
                check_resolvable(_child(node, name, key), key)
    elif isinstance(node, ListConfig):
        for index in range(len(node)):
            check_resolvable(_child(node, index, f"{prefix}[{index}]"), f"{prefix}[{index}]")


def resolved(cfg: DictConfig) -> Optional[dict]:
    """The config as plain, resolved Python values (Hydra's own node left out); None when something does not resolve."""
    try:
        return {
            str(k): OmegaConf.to_container(v, resolve=True) if isinstance(v, (DictConfig, ListConfig)) else v
            for k in cfg.keys()
            if k != "hydra"
            for v in [_child(cfg, k, str(k))]
        }
    except (OmegaConfBaseException, ConfigError):
        return None


def check_plain(plain: dict) -> None:
    """Type and range of every key of a resolved config (plain data), in the table's order."""
    check_profile_type(plain)
    check_table(plain)
    check_target_args(plain)
    check_target_paths(plain)


def _overlaps(pattern: str, changed: Sequence[Tuple[str, ...]]) -> bool:
    """A rule's dotted pattern (`*` any child) and a changed key overlap: one is the other or inside it."""
    parts = pattern.split(".")
    return any(all(p == "*" or p == q for p, q in zip(parts, path)) for path in changed)


def check_changed(plain: dict, changed: Sequence[Sequence[Any]]) -> None:
    """check_plain for a config equal to an already checked one except at the `changed` key paths.

    A sweep's jobs differ from their shared composition in a few values: only the rules (and
    shipped _target_ arguments) that can see those keys are checked again, in the table's order.
    """
    paths = [tuple(str(part) for part in path) for path in changed]
    if not paths:
        return
    if any(path[0] == "cluster" for path in paths):
        check_profile_type(plain)
    for rule in RULES:
        if _overlaps(rule.key, paths):
            for key, value in lookup(plain, rule.key):
                _apply(key, value, rule)
    if any(_overlaps(node_key, paths) for node_key in TARGET_NODES):
        check_target_args(plain)
    for path in paths:  # the _target_s inside (or at) a changed key
        node: Any = plain
        for part in path:
            node = node.get(part) if isinstance(node, Mapping) else None
        if isinstance(node, str) and path[-1] == "_target_":
            _check_target_path(".".join(path), node)
        elif node is not None:
            check_target_paths(node, ".".join(path))


def checked_view(cfg: DictConfig) -> ConfigView:
    """The config resolved once and checked key by key (raises ConfigError): what the rest of the login side reads.

    The table is checked in its order (so the key a bad value comes from is named first); a
    value that does not resolve is named by ``check_resolvable``.
    """
    plain = resolved(cfg)
    if plain is None:
        check_profile_type(cfg)
        check_table(cfg)
        check_target_args(cfg)
        check_resolvable(cfg)
        raise ConfigError("config", "a value does not resolve.", "run with HYDRA_FULL_ERROR=1 to see which.")
    check_plain(plain)
    complete(plain)
    return ConfigView(plain)


def check_keys(cfg: DictConfig) -> None:
    """Type and range of every key, before the layout is computed or anything runs; raises ConfigError."""
    checked_view(cfg)


# -- mappings given whole on the command line ----------------------------------------------------
def whole_mappings(overrides: Sequence[str]) -> List[str]:
    """The overrides, with each that gives a mapping key a whole mapping (``cluster.extra={exclusive:true}``) as ``++``.

    Hydra merges ``key={...}`` into the node the config ships under the config's struct flag, which
    refuses every key that node lacks: a profile shipping ``extra: {}`` refused any sbatch option
    given whole, and a shipped ``trainer.loss`` any argument it does not set. ``++`` is Hydra's
    same merge with the flag lifted: the given keys are added, the shipped keys they do not name
    are kept, and the table checks the merged mapping. Only keys the table declares as mappings,
    written without a prefix of their own; every other override is left to Hydra as typed.
    """
    return [f"++{override}" if _gives_whole_mapping(override) else override for override in overrides]


def _gives_whole_mapping(override: str) -> bool:
    key, sep, value = override.partition("=")
    return bool(sep) and key in MAPPING_KEYS and value.lstrip().startswith("{")


def complete(plain: dict) -> list:
    """Fill every declared key a (resolved, checked) config leaves out with its default; the keys filled.

    Only inside sections the config has, and strategy keys only for the strategies they apply to
    (``Rule.only``). After this every reader (the layout, the job spec, the ranks) reads the
    value itself, with no fallback of its own: the default is written once, in its declaration.
    """
    filled = []
    strategy = plain.get("strategy")
    chosen = strategy_id(strategy) if isinstance(strategy, Mapping) else None
    for rule in RULES:
        if not rule.has_default or "*" in rule.key:
            continue
        *parents, name = rule.key.split(".")
        node: Any = plain
        for part in parents:
            node = node.get(part) if isinstance(node, Mapping) else None
        if not isinstance(node, dict) or name in node:
            continue
        if rule.only and (parents[:1] != ["strategy"] or chosen not in rule.only):
            continue
        node[name] = copy_plain(rule.default)
        filled.append(rule.key)
    return filled
