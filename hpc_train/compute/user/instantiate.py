"""Building one of the user's config nodes (``_target_`` and its arguments) with Hydra's ``instantiate``, and
making their code importable in this rank: what goes wrong is a Refusal naming the config key.

Below both the user-code builders (building.py) and the training parts that take a user's
``_target_`` (the step, the optimizer and schedule), so neither imports the other for it.
"""

from __future__ import annotations

import re
import sys
from typing import Any, Sequence

from hydra.utils import instantiate
from omegaconf import DictConfig

from hpc_train.compute.runtime.refusal import Refusal


def add_code_dirs(dirs: Sequence[str]) -> None:
    """Make the submitting directory and PYTHONPATH of the login side importable in this rank."""
    for path in reversed([str(d) for d in dirs if d]):
        if path not in sys.path:
            sys.path.insert(0, path)


def _reason(err: BaseException) -> str:
    """Hydra's instantiate error in one line, without its advice about HYDRA_FULL_ERROR."""
    text = str(err.__cause__ or err) if not str(err).startswith("Error in call to target") else str(err)
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.strip().startswith("full_key:")]
    line = " ".join(lines)
    return re.sub(r",? ?set env var HYDRA_FULL_ERROR=1 to see chained exception\.?", "", line).strip()


def instantiate_node(node: Any, key: str, what: str) -> Any:
    """``instantiate(node)``; a Refusal naming `key` when the target cannot be imported or called."""
    target = node.get("_target_") if isinstance(node, DictConfig) else None
    if not target:
        raise Refusal(
            f"`{key}` has no _target_: it must name the {what} to build. Fix: set {key}._target_=my_package.MyClass (a"
            " class or factory importable on the compute nodes)."
        )
    try:
        return instantiate(node)
    except Exception as err:  # InstantiationException wraps import errors and the callee's TypeError/ValueError
        raise Refusal(
            f"`{key}`: cannot build {target} ({_reason(err)}). Fix: check {key}._target_ and that every other key of"
            f" {key} is an argument of {target}; the module must be importable where the job runs (its folder is the"
            " submitting directory or on PYTHONPATH)."
        ) from None
