"""The arguments of the shipped ``_target_`` s (torchvision ResNets, ``toy_mlp``, the digits, synthetic and
image-folder datasets), checked where a model or data node names one; a user's own ``_target_`` is checked when
the job starts (``hpc_train/compute/user/building.py``).

A table, not ``inspect.signature``: the login side never imports torch. A unit test compares it with the
signatures of the real functions (tests/unit/test_target_args.py, which may import torch).
"""

from __future__ import annotations

from hpc_train.config.checks import PATH_TEXT, flag, number, one_of, whole

_CLASSES = (whole(1), 10, "The number of classes (the model's output size).")
_IMAGE = {"image_size": (whole(1, 65536), 32, "The side of the square images.")}
_RESNETS = {f"torchvision.models.resnet{n}": {"num_classes": _CLASSES} for n in (18, 34, 50, 101, 152)}
# Arguments of the shipped _target_s, checked where a node names one (a user's own: at job start):
# argument -> (check, example, one-line doc).
TARGET_ARGS = {
    **_RESNETS,
    "hpc_train.compute.models.toy_mlp": {
        **_IMAGE,
        "num_classes": _CLASSES,
        "hidden": (whole(1), 64, "The hidden layer's width."),
        "in_channels": (whole(1), 3, "Channels of the input images."),
    },
    "hpc_train.compute.datasets.digits": {
        "split": (one_of("train", "val"), "train", "Which split this node reads."),
        **_IMAGE,
        "val_fraction": (number(0, 1, True, True), 0.2, "The fraction held out for validation (a fixed split)."),
    },
    "hpc_train.compute.datasets.synthetic": {
        "num_samples": (whole(1), 1024, "Samples generated (once, held in memory)."),
        **_IMAGE,
        "num_classes": _CLASSES,
        "seed": (whole(0, 2**32 - 1), 1, "The seed of the generated images and labels."),
    },
    "hpc_train.compute.datasets.image_folder": {
        "root": (PATH_TEXT, "/path/to/dataset", "The folder holding the splits."),
        "split": (PATH_TEXT, "train", "The split's folder under root (one sub-folder per class)."),
        **_IMAGE,
        "augment": (flag, "true", "Random resized crops and flips."),
    },
}
TARGET_NODES = ("model", "data.train", "data.val")
