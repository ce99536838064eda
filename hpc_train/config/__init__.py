"""Every configuration key hpc-train reads, declared once: readable by the login side and the ranks alike.

Nothing here imports torch, Hydra, hpc_train.launch or hpc_train.compute; only ``engine`` (the
login side's checks of a composed config) imports OmegaConf, and it is not loaded from here.

* ``checks``: the value checkers the declarations are made of.
* ``rule``: ``Rule``, one declared key (type, default, range, doc, what null means, strategies).
* one module per config group (``top``, ``resources``, ``launcher``, ``cluster``, ``strategy``,
  ``trainer``, ``script``, ``logger``, ``data``, ``model``) and ``targets`` (the shipped
  ``_target_`` s' arguments); ``table`` puts them in one ``RULES`` tuple.
* ``engine``: applies them to a composed config; ``errors``, ``view``: what it raises and returns.

The public API for typed settings: ``RULES``, ``DEFAULTS``, ``Rule``, ``declared(section)``,
``default_of(key)``.
"""

from hpc_train.config.rule import NO_DEFAULT, Rule
from hpc_train.config.table import DEFAULTS, MAPPING_KEYS, RULES, declared, default_of

__all__ = ["DEFAULTS", "MAPPING_KEYS", "NO_DEFAULT", "RULES", "Rule", "declared", "default_of"]
