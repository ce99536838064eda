"""RULES: every declared key, the groups' declarations in one tuple, and what is derived from it.

Order matters: a key is listed before the keys that interpolate it, and the engine checks in
this order, so the key a bad value comes from is named first.
"""

from __future__ import annotations

from typing import Any, Dict, List, Tuple

from hpc_train.config import (
    cluster,
    container,
    data,
    fault_tolerance,
    launcher,
    logger,
    model,
    resources,
    script,
    strategy,
    top,
    trainer,
)
from hpc_train.config.rule import Rule

RULES: Tuple[Rule, ...] = (
    *top.RULES,
    *resources.RULES,
    *launcher.RULES,
    *cluster.RULES,
    *strategy.RULES,
    *trainer.RULES,
    *fault_tolerance.RULES,
    *script.RULES,
    *container.RULES,
    *logger.RULES,
    *data.RULES,
    *model.RULES,
)

# "trainer.grad_accum_steps" -> 1: what a config without the key runs with
DEFAULTS: Dict[str, Any] = {rule.key: rule.default for rule in RULES if rule.has_default and "*" not in rule.key}

MAPPING_KEYS = frozenset(rule.key for rule in RULES if rule.mapping)  # may be given whole: key={...}


def declared(section: str) -> List[Rule]:
    """The rules of one config section (``trainer``, ``strategy``, ...; ``""``: the top-level keys), in table order."""
    return [rule for rule in RULES if (rule.key.partition(".")[0] if "." in rule.key else "") == section]


def default_of(key: str) -> Any:
    """The declared default of a dotted key; KeyError when the key has none (it is required, or has no such rule)."""
    return DEFAULTS[key]
