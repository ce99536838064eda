"""Build the user's model, datasets and loss from their config nodes, and check they fit together.

Every node is handed whole to ``hydra.utils.instantiate``: ``_target_`` is a class or factory
from the user's package, every other key a constructor argument (nothing is injected). What
goes wrong here (a missing module, a wrong keyword, a dataset whose items the model cannot
take) is the user's to fix, so it becomes a :class:`Refusal` naming the config key, raised at
the start of the job before any training step.
"""

from __future__ import annotations

import copy
import itertools
from dataclasses import dataclass
from typing import Any, Callable, List, Mapping, Optional

import torch
import torch.nn as nn
from torch.utils.data import Dataset, default_collate

from hpc_train.compute.data.batch import describe
from hpc_train.compute.data.loaders import DataSettings, is_stream
from hpc_train.compute.runtime.refusal import Refusal
from hpc_train.compute.user.instantiate import instantiate_node
from hpc_train.compute.user.step import check_step, is_builtin

DATA_LOADER_KEYS = ("num_workers", "pin_memory", "collate_fn")  # data.* keys the loaders read, never the datasets


@dataclass
class Datasets:
    train: Dataset
    val: Optional[Dataset]
    collate_fn: Optional[Callable] = None  # None: PyTorch's default (data.collate_fn=null)

    def collated(self, items: List[Any]) -> Any:
        """`items` as one batch, collated as the loaders collate them."""
        return (default_collate if self.collate_fn is None else self.collate_fn)(items)


def build_model(node: Mapping[str, Any]) -> nn.Module:
    """The model the ``model`` node builds."""
    model = instantiate_node(node, "model", "model (an nn.Module class or factory)")
    if not isinstance(model, nn.Module):
        raise Refusal(
            f"`model`: {node['_target_']} returned a {type(model).__name__}, not a torch.nn.Module. Fix: point"
            " model._target_ at an nn.Module class or a function returning one."
        )
    return model


def build_datasets(settings: DataSettings) -> Datasets:
    train = instantiate_node(settings.train, "data.train", "training dataset")
    val_node = settings.val
    val = instantiate_node(val_node, "data.val", "validation dataset") if val_node is not None else None
    collate_node = settings.collate_fn
    collate = (
        instantiate_node(collate_node, "data.collate_fn", "collate function") if collate_node is not None else None
    )
    for key, dataset in (("data.train", train), ("data.val", val)):
        if (
            dataset is not None
            and not is_stream(dataset)
            and not (hasattr(dataset, "__getitem__") and hasattr(dataset, "__len__"))
        ):
            raise Refusal(
                f"`{key}`: {type(dataset).__name__} is neither a map-style dataset (__getitem__ and __len__) nor a"
                " torch.utils.data.IterableDataset. Fix: return a torch.utils.data.Dataset or IterableDataset."
            )
    if not is_stream(train) and len(train) == 0:
        raise Refusal(
            f"`data.train`: the training set is empty. Fix: check the arguments of {settings.train['_target_']}."
        )
    return Datasets(train=train, val=val, collate_fn=collate)


def build_loss(node: Mapping[str, Any]) -> Callable:
    """The loss the ``trainer.loss`` node builds."""
    loss = instantiate_node(node, "trainer.loss", "loss (e.g. torch.nn.CrossEntropyLoss)")
    if not callable(loss):
        raise Refusal(
            f"`trainer.loss`: {node['_target_']} built a {type(loss).__name__}, which cannot be called. Fix:"
            " name a loss class, or a loss function with _partial_: true."
        )
    return loss


def first_items(dataset: Any, count: int) -> List[Any]:
    """The first `count` items of a dataset; a stream is read from a copy, so its own position does not move."""
    if not is_stream(dataset):
        return [dataset[i] for i in range(min(count, len(dataset)))]
    try:
        probe = copy.deepcopy(dataset)
    except Exception:
        probe = dataset
    return list(itertools.islice(iter(probe), count))


def collate(data: Datasets, count: int) -> Any:
    """A batch of the first `count` training items, collated as the loader does."""
    return data.collated(first_items(data.train, count))


def _pair(item: Any, key: str) -> None:
    if not (isinstance(item, (tuple, list)) and len(item) == 2):
        kind = f"a {len(item)}-tuple" if isinstance(item, (tuple, list)) else describe(item)
        hint = (
            " or, for a model that computes its own loss (Hugging Face: labels in the batch), set"
            " trainer.step=hpc_train.steps.model_loss (a _target_ with _partial_: true), or your own"
            " step(model, batch)"
        )
        raise Refusal(
            f"`{key}`: the built-in training step (trainer.step=null) takes (input, target) pairs, but item 0 is"
            f" {kind}. Fix: make __getitem__ return (input, target),{hint}."
        )


def _shape(x: Any) -> str:
    return f"shape {tuple(x.shape)}" if isinstance(x, torch.Tensor) else type(x).__name__


def check_fit(model: nn.Module, step: Callable, loss_fn: Callable, data: Datasets) -> List[str]:
    """One tiny batch through the training step, on the CPU, before any training; the step's metric names.

    A dataset yielding the wrong shape, a loss that does not match the model's output or a user
    step that fails is refused here, naming the key, instead of failing inside the first step of
    every rank.
    """

    items = first_items(data.train, 2)
    if not items:
        raise Refusal("`data.train`: it yielded no item. Fix: check its arguments (and its sharding).")
    if not is_builtin(step):
        return check_step(step, model, data.collated(items))
    check_pairs(model, loss_fn, data, items)
    return []


def check_pairs(model: nn.Module, loss_fn: Callable, data: Datasets, train_items: List[Any]) -> None:
    """The built-in step: (input, target) items, the model takes the inputs, the loss compares output and target."""
    _pair(train_items[0], "data.train")
    val_items = first_items(data.val, 1) if data.val is not None else []
    if val_items:
        _pair(val_items[0], "data.val")
        train_in, val_in = train_items[0][0], val_items[0][0]
        if isinstance(train_in, torch.Tensor) and isinstance(val_in, torch.Tensor) and train_in.shape != val_in.shape:
            raise Refusal(
                f"`data.val`: its inputs have {_shape(val_in)}, the training inputs {_shape(train_in)}. Fix: give both"
                " datasets the same input shape."
            )
    inputs, targets = data.collated(train_items)
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            try:
                outputs = model(inputs)
            except Exception as err:
                raise Refusal(
                    f"`data.train`: the model ({type(model).__name__}) cannot take a batch of its inputs"
                    f" ({_shape(inputs)}): {type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}. Fix:"
                    " make the dataset yield what the model expects, or change the model's arguments."
                ) from None
            try:
                loss = loss_fn(outputs, targets)
            except Exception as err:
                hint = (
                    " For a model that computes its own loss, set trainer.step to a function step(model, batch) that"
                    " returns it."
                    if isinstance(outputs, (tuple, list, dict))
                    else ""
                )
                raise Refusal(
                    f"`trainer.loss`: the loss cannot compare the model's output ({_shape(outputs)}) with the targets"
                    f" ({_shape(targets)}): {type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}. Fix:"
                    f" choose a loss for this kind of target, or fix the dataset's targets.{hint}"
                ) from None
            if not (isinstance(loss, torch.Tensor) and loss.numel() == 1):
                raise Refusal(
                    f"`trainer.loss`: it returned {_shape(loss)}, not one number. Fix: use a loss with reduction='mean'"
                    " (or 'sum')."
                )
    finally:
        model.train(was_training)


def is_classification(outputs: torch.Tensor, targets: Any) -> bool:
    """Class logits against integer labels: the only case where accuracy means something."""
    return (
        isinstance(targets, torch.Tensor)
        and outputs.dim() == 2
        and targets.dim() == 1
        and not targets.is_floating_point()
        and not targets.is_complex()
        and outputs.shape[0] == targets.shape[0]
    )
