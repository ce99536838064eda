"""The training steps shipped with hpc-train, by their public names: name one in ``trainer.step`` (a ``_target_``
with ``_partial_: true``), e.g. ``trainer.step={_target_:hpc_train.steps.model_loss,_partial_:true}``.

These names stay where they are whatever the package's layout; the functions live in
``hpc_train.compute.training.steps``. Importing this module does not import torch.
"""

from hpc_train.compute.training.steps import model_loss

__all__ = ["model_loss"]
