"""The job's config after Hydra composed it and ``engine.check_keys`` read it: plain data with dotted access.

Why not keep reading the DictConfig: every attribute of a DictConfig is resolved again on each
read (~10 us), and copying one with Hydra's node costs ~20 ms. The login side reads the config
once, resolved (``engine.checked_view``), and every later step (layout, validation, sbatch
parameters, the job spec) reads this view: ``cfg.trainer.batch_size``, ``cfg.cluster.get("qos")``,
``cfg.strategy["stages"]``, ``"step" in cfg.trainer``, as with a DictConfig. It is read-only;
``plain()`` gives a deep copy of the data (what the job spec is made of).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any, Iterator

MISSING_TEXT = "???"  # OmegaConf's mandatory value, left as text in a resolved container


def copy_plain(value: Any) -> Any:
    """A deep copy of plain data (dicts, lists, values): several times faster than copy.deepcopy."""
    kind = type(value)
    if kind is dict:
        return {key: copy_plain(item) for key, item in value.items()}
    if kind is list:
        return [copy_plain(item) for item in value]
    return value if kind in (str, int, float, bool, type(None)) else copy.deepcopy(value)


def wrap(value: Any) -> Any:
    """Mappings become views, lists lists of wrapped items; plain values stay as they are."""
    if type(value) is dict:
        return ConfigView(value)
    if isinstance(value, Mapping) and not isinstance(value, ConfigView):
        return ConfigView(value)
    if isinstance(value, list):
        return [wrap(item) for item in value]
    return value


class ConfigView(Mapping):
    __slots__ = ("_data",)

    def __init__(self, data: Mapping) -> None:
        object.__setattr__(self, "_data", data)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        try:
            return wrap(self._data[name])
        except KeyError:
            raise AttributeError(f"the config has no key {name!r}") from None

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("the resolved config is read-only")

    def __getitem__(self, key: Any) -> Any:
        return wrap(self._data[key])

    def __iter__(self) -> Iterator[Any]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)

    def __repr__(self) -> str:
        return f"ConfigView({self._data!r})"

    def is_missing(self, key: str) -> bool:
        """True when `key` is absent or `???` (OmegaConf.is_missing for a resolved config)."""
        return self._data.get(key, MISSING_TEXT) == MISSING_TEXT

    def select(self, dotted: str, default: Any = None) -> Any:
        """The value at a dotted key, `default` when some part of it is missing."""
        node: Any = self._data
        for part in dotted.split("."):
            if not isinstance(node, Mapping) or part not in node:
                return default
            node = node[part]
        return wrap(node)

    def raw(self) -> Any:
        """The data itself, not a copy (read it, never change it): for walks over a whole big config."""
        return self._data

    def plain(self) -> Any:
        """A deep copy of the data: dicts, lists and values only."""
        return copy_plain(self._data)


def plain(value: Any) -> Any:
    """Plain Python data from a view, a list of views, or a value (a deep copy)."""
    if isinstance(value, ConfigView):
        return value.plain()
    return copy_plain(value)
