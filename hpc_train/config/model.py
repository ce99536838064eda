"""The model group: the model node."""

from __future__ import annotations

from typing import Tuple

from hpc_train.config.checks import target_node
from hpc_train.config.rule import R, Rule

RULES: Tuple[Rule, ...] = (
    R(
        "model",
        target_node,
        "torchvision.models.resnet18",
        required=True,
        fix="pick a model (model=resnet18) or give a node whose _target_ names an nn.Module class or factory.",
        doc="The model: a node whose _target_ names an nn.Module class or factory (its other keys are the arguments).",
        mapping=True,
    ),
)
