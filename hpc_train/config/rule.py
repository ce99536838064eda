"""One declared configuration key (``Rule``) and ``R``, the short form the declaration modules write it in."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Tuple

from hpc_train.config.checks import Checker

NO_DEFAULT: Any = type("NoDefault", (), {"__repr__": lambda self: "NO_DEFAULT"})()  # no value filled in (see Rule)


@dataclass(frozen=True)
class Rule:
    """One configuration key, declared once: what it accepts, what it means, what a config without it runs with.

    Each rule says what a config without the key means, in exactly one way: ``default``, the
    value the job runs with (a user's own option may leave keys out; ``engine.complete`` fills
    them in before anything reads the config, so no reader keeps a fallback of its own);
    ``required``, the config must have it (the shipped YAML gives its value, in that one place);
    or ``left_out``, why no value is filled in (a key only some options use). The shipped options'
    values are checked against ``check``, and against ``default`` where they restate it, by
    tests/unit/test_config_keys.py. ``only``: for strategy keys, the strategies (``strategy_table``
    identities) the key means something to, so a ``single`` job is not given pipeline settings.
    ``mapping``: the value may be a mapping of keys the shipped node need not have (sbatch
    options, a ``_target_`` and its arguments), so one given whole is merged as given (``whole_mappings``).
    """

    key: str
    check: Checker
    example: str  # the value shown in the fix: "set {key}={example}"
    null: Optional[str] = None  # what null means, when null is allowed
    required: bool = False
    fix: Optional[str] = None  # the whole fix sentence, where an example alone says too little
    doc: str = ""  # one line for the configuration reference
    default: Any = NO_DEFAULT
    only: Tuple[str, ...] = ()
    mapping: bool = False
    left_out: str = ""  # what a config without the key means where no default is filled in

    def fix_for(self, key: str) -> str:
        if self.fix:
            return self.fix
        tail = f", or {key}=null ({self.null})" if self.null else ""
        return f"set e.g. {key}={self.example}{tail}."

    @property
    def has_default(self) -> bool:
        return self.default is not NO_DEFAULT


def R(
    key: str,
    check: Checker,
    example: Any,
    null: Optional[str] = None,
    required: bool = False,
    fix: Optional[str] = None,
    doc: str = "",
    default: Any = NO_DEFAULT,
    only: Tuple[str, ...] = (),
    mapping: bool = False,
    left_out: str = "",
) -> Rule:
    return Rule(key, check, str(example), null, required, fix, doc, default, only, mapping, left_out)
