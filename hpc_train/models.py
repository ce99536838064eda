"""The models shipped with hpc-train, by their public names: name one in ``model._target_``, e.g.
``_target_: hpc_train.models.toy_mlp``.

These names stay where they are whatever the package's layout; the functions live in
``hpc_train.compute.models``. Importing this module imports torch (it is read on a rank, or by a user's own code).
"""

from hpc_train.compute.models import toy_mlp

__all__ = ["toy_mlp"]
