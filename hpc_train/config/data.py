"""The data group: plain keys of the shipped options (and of a user's own node that uses these names), then the
dataset nodes."""

from __future__ import annotations

from typing import Tuple

from hpc_train.config.checks import PATH_TEXT, flag, number, target_node, whole
from hpc_train.config.rule import R, Rule

RULES: Tuple[Rule, ...] = (
    R(
        "data.root",
        PATH_TEXT,
        "/path/to/dataset",
        fix="pass data.root=/path/to/dataset, a folder holding train/ and val/ with one sub-folder per class.",
        doc="imagefolder: the folder holding train/ and val/, one sub-folder per class.",
        left_out="nothing reads it but data=imagefolder (its interpolations and the check of its folders)",
    ),
    R(
        "data.train_dir",
        PATH_TEXT,
        "train",
        doc="imagefolder: the training split's folder under root.",
        left_out="nothing reads it but the interpolations of the data option that sets it",
    ),
    R(
        "data.val_dir",
        PATH_TEXT,
        "val",
        doc="imagefolder: the validation split's folder under root.",
        left_out="nothing reads it but the interpolations of the data option that sets it",
    ),
    R(
        "data.image_size",
        whole(1, 65536),
        32,
        doc="The side of the (square) images the datasets produce.",
        left_out="nothing reads it but the interpolations of the data option that sets it",
    ),
    R(
        "data.num_classes",
        whole(1),
        10,
        fix="pass data.num_classes=N, the number of classes (at least 1).",
        doc="The number of classes (the model nodes read it).",
        left_out="nothing reads it but the interpolations of the data option that sets it",
    ),
    R(
        "data.num_samples",
        whole(1),
        1024,
        doc="synthetic: training samples (generated once, held in memory).",
        left_out="nothing reads it but the interpolations of the data option that sets it",
    ),
    R(
        "data.val_samples",
        whole(1),
        256,
        doc="synthetic: validation samples.",
        left_out="nothing reads it but the interpolations of the data option that sets it",
    ),
    R(
        "data.val_fraction",
        number(0, 1, low_open=True, high_open=True),
        0.2,
        doc="digits: the fraction held out for validation.",
        left_out="nothing reads it but the interpolations of the data option that sets it",
    ),
    R(
        "data.num_workers",
        whole(0, 1024),
        4,
        doc="DataLoader worker processes per rank (not passed to the datasets).",
        default=0,
    ),
    R("data.pin_memory", flag, "true", doc="DataLoader pin_memory (on GPUs only).", default=False),
    R(
        "data.train",
        target_node,
        "my_package.MyDataset",
        required=True,
        fix=(
            "set data.train._target_=my_package.MyDataset (its other keys are the constructor's arguments); see"
            " conf/data/synthetic.yaml."
        ),
        doc="The training dataset: a node whose _target_ builds it (its other keys are the arguments).",
        mapping=True,
    ),
    R(
        "data.val",
        target_node,
        "my_package.MyDataset",
        null="no evaluation",
        doc="The validation dataset, like data.train; null: no evaluation.",
        default=None,
        mapping=True,
    ),
    R(
        "data.collate_fn",
        target_node,
        "my_package.collate",
        null="PyTorch's default collate",
        fix=(
            "set data.collate_fn._target_=my_package.collate with data.collate_fn._partial_=true, or"
            " data.collate_fn=null."
        ),
        doc="A partial collate function for the DataLoader; null: PyTorch's default.",
        default=None,
        mapping=True,
    ),
)
