"""Which loggers a config picks, and the package each needs: the one table both sides read (no torch).

Users pick loggers with ``logger=<name>``, or several with Hydra's list syntax for a config group,
``logger=[tensorboard,mlflow]``. Hydra merges the chosen options into one ``logger`` node, so
each option file names itself twice: ``name: <itself>`` (the last option's name wins the merge)
and ``trackers: {<itself>: true}`` (a mapping, so the merge keeps every option's entry).
``metrics.jsonl`` is always written; ``jsonl`` is no tracker (``trackers: {}``).

The launch side (hpc_train.launch.planning.validate) checks the choice and looks for the packages without
importing them; the compute side (hpc_train.compute.training.loggers) builds one tracker per name.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, List, NamedTuple, Optional

from hpc_train.config import default_of


class Tracker(NamedTuple):
    module: str  # what `import` needs (looked up with importlib.util.find_spec on the login node)
    pip: str  # the hint of the refusal when that module is missing


TRACKERS = {
    "tensorboard": Tracker("tensorboard", "pip install 'hpc-train[tensorboard]' (or pip install tensorboard)"),
    "wandb": Tracker("wandb", "pip install 'hpc-train[wandb]' (or pip install wandb)"),
    "mlflow": Tracker("mlflow", "pip install 'hpc-train[mlflow]' (or pip install mlflow-skinny)"),
}
LOGGERS = ("jsonl", *TRACKERS)  # what logger=<name> accepts


class Choice(NamedTuple):
    trackers: List[str]  # the trackers to run beside metrics.jsonl, in table order
    problem: Optional[str]  # why the logger node makes no sense (None: fine)


def chosen(node: Any) -> Choice:
    """The trackers a ``logger`` node picks (a mapping, None when the config has no logger node)."""
    if node is None:
        return Choice([], None)  # ~logger: metrics.jsonl only
    if not isinstance(node, Mapping):
        return Choice([], f"the logger node must be a config node such as {{name: tensorboard}}, got {node!r}")
    name = node.get("name", default_of("logger.name"))
    if not isinstance(name, str) or name not in LOGGERS:
        return Choice([], f"unknown logger {name!r}")
    if "trackers" not in node:  # a logger option of one's own written before trackers existed: its name says it
        return Choice([] if name == "jsonl" else [name], None)
    flags = node["trackers"]
    if flags is None:
        flags = {}
    if not isinstance(flags, Mapping):
        return Choice([], f"logger.trackers must map tracker names to true/false, got {flags!r}")
    for key, value in flags.items():
        if key not in TRACKERS:
            return Choice([], f"unknown logger {key!r} in logger.trackers")
        if not isinstance(value, bool):
            return Choice([], f"logger.trackers.{key} must be true or false, got {value!r}")
    on = [key for key in TRACKERS if flags.get(key)]
    if name != "jsonl" and name not in flags:
        picked = ",".join(["jsonl", *on]) if on else "jsonl"
        return Choice(
            [],
            f"logger.name={name} but the logger options chosen are [{picked}] (logger.name alone does not pick a"
            " logger)",
        )
    return Choice(on, None)
