"""Training steps shipped with hpc-train, to name in ``trainer.step`` (a ``_target_`` with ``_partial_: true``).

A step is a function ``step(model, batch)`` returning the loss (a scalar tensor) or a dict
with ``loss`` and other scalar metrics; see hpc_train.compute.user.step for the contract.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def model_loss(model: Any, batch: Any) -> Any:
    """For models that compute their own loss (Hugging Face ``...ForCausalLM``, ``labels`` in the batch).

    Calls ``model(**batch)`` for a mapping, ``model(*batch)`` for a tuple or list, ``model(batch)``
    otherwise, and returns the output's ``.loss`` attribute or ``["loss"]`` item.
    """
    # compute side (data.batch imports torch): this runs in a training process; importing
    # hpc_train.compute.training.steps does not
    from hpc_train.compute.data.batch import describe
    from hpc_train.compute.runtime.refusal import Refusal

    if isinstance(batch, Mapping):
        output = model(**batch)
    elif isinstance(batch, (tuple, list)):
        output = model(*batch)
    else:
        output = model(batch)
    loss = getattr(output, "loss", None)
    if loss is None and isinstance(output, Mapping):
        loss = output.get("loss")
    if loss is None:
        has_none = hasattr(output, "loss") or (isinstance(output, Mapping) and "loss" in output)
        raise Refusal(
            "`trainer.step`: hpc_train.steps.model_loss needs an output with a loss, but the model"
            f" returned {describe(output)}{' whose loss is None' if has_none else ''}. Fix: give the batch what the"
            " model needs to compute its loss (Hugging Face: a 'labels' key), or set trainer.step to your own function"
            " that returns the loss (e.g. `_, loss = model(x, y); return loss` for a model returning (logits, loss))."
        )
    return loss
