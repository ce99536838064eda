"""The datasets shipped with hpc-train, by their public names: name one in ``data.train._target_`` and
``data.val._target_``, e.g. ``_target_: hpc_train.datasets.digits``.

These names stay where they are whatever the package's layout; the functions live in
``hpc_train.compute.datasets``. Importing this module imports torch (it is read on a rank, or by a user's own code).
"""

from hpc_train.compute.datasets import digits, image_folder, synthetic

__all__ = ["digits", "image_folder", "synthetic"]
