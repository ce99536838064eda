"""The step contract in one process: batches of any structure move to the device keeping their types, model_loss calls
the model the way the batch is shaped, and a step's result is a scalar loss or a mapping with 'loss'."""

from __future__ import annotations

from collections import OrderedDict, namedtuple
from types import SimpleNamespace

import pytest
import torch
import torch.nn as nn

from hpc_train.compute.data.batch import batch_size, describe, to_device
from hpc_train.compute.runtime.refusal import Refusal
from hpc_train.compute.training.steps import model_loss
from hpc_train.compute.user.step import split_result


# -- batches of any structure -------------------------------------------------------------------
def test_every_tensor_leaf_moves_and_containers_keep_their_type():
    Pair = namedtuple("Pair", "x y")
    batch = OrderedDict(
        ids=torch.zeros(3, 4, dtype=torch.long), nested=[Pair(torch.ones(3, 2), 7), (torch.zeros(3, 1, 2, 2),)]
    )
    moved = to_device(batch, torch.device("cpu"), channels_last=True)
    assert type(moved) is OrderedDict and isinstance(moved["nested"][0], Pair) and moved["nested"][0].y == 7
    image = moved["nested"][1][0]
    assert image.is_contiguous(memory_format=torch.channels_last), "4-D float leaves go channels-last"
    assert moved["ids"].dtype == torch.long and moved["ids"].is_contiguous()
    assert batch_size(batch) == 3 and batch_size({"x": [torch.zeros(5)]}) == 5


def test_a_hugging_face_batch_encoding_stays_one():
    transformers = pytest.importorskip("transformers")
    batch = transformers.BatchEncoding({"input_ids": torch.zeros(2, 3, dtype=torch.long)})
    moved = to_device(batch, torch.device("cpu"))
    assert isinstance(moved, transformers.BatchEncoding) and batch_size(moved) == 2


class OwnLoss(nn.Module):
    """Returns what the mode says: an object with .loss, a dict, or a (logits, loss) tuple."""

    def __init__(self, mode: str) -> None:
        super().__init__()
        self.mode, self.w = mode, nn.Parameter(torch.ones(1))

    def forward(self, x, labels=None):
        loss = (self.w * x).mean() if labels is not None else None
        return {"obj": SimpleNamespace(loss=loss), "dict": {"loss": loss}, "tuple": (x, loss)}[self.mode]


# -- the shipped model_loss step and the result contract ---------------------------------------------
def test_model_loss_calls_the_model_the_way_the_batch_is_shaped():
    x = torch.arange(4.0)
    assert model_loss(OwnLoss("obj"), {"x": x, "labels": x}).item() == pytest.approx(1.5)
    assert model_loss(OwnLoss("dict"), (x, x)).item() == pytest.approx(1.5)
    with pytest.raises(Refusal, match=r"`trainer.step`.*returned a tuple of 2.*Fix:"):
        model_loss(OwnLoss("tuple"), (x, x))
    with pytest.raises(Refusal, match=r"whose loss is None.*labels"):
        model_loss(OwnLoss("obj"), {"x": x})


def test_a_step_result_is_a_scalar_loss_or_a_mapping_with_loss():
    w = torch.ones(3, requires_grad=True)
    loss, metrics = split_result({"loss": w.sum(), "acc": 0.5, "n": torch.tensor([2.0])})
    assert loss.item() == 3.0 and {k: float(v) for k, v in metrics.items()} == {"acc": 0.5, "n": 2.0}
    for bad, words in [
        (w * 2, "not one number"),
        ({"total": w.sum()}, "without a 'loss' key"),
        ((w.sum(), 1), "returned a tuple"),
        (w.sum().detach(), "does not require grad"),
        ({"loss": w.sum(), "acc": torch.ones(2)}, "metric 'acc'"),
    ]:
        with pytest.raises(Refusal, match=words):
            split_result(bad)
    assert "keys input_ids" in describe({"input_ids": 1})
