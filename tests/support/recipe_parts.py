"""User code for the recipe tests (tests/e2e/test_recipes.py), named by _target_ as a user's package would be."""

import torch
import torch.nn.functional as F
from torch.utils.data import IterableDataset

from hpc_train.compute.datasets import synthetic


def zero_loss(outputs, targets):
    """A loss whose gradient is zero everywhere: only weight decay moves the parameters."""
    return outputs.sum() * 0.0


def halve_first_layer(model):
    """Parameter groups of a user's own rule: the first Linear at half the LR, everything else at the LR."""
    first = list(model[1].parameters())
    ids = {id(p) for p in first}
    return [{"params": [p for p in model.parameters() if id(p) not in ids]}, {"params": first, "lr": 0.025}]


def step_with_tokens(model, batch):
    """The built-in computation, plus a count of 'tokens' (here 3 per sample) for tokens_per_sec."""
    inputs, labels = batch
    return {"loss": F.cross_entropy(model(inputs), labels), "tokens": torch.tensor(3 * inputs.shape[0])}


class SyntheticStream(IterableDataset):
    """The synthetic images as a stream without __len__ (a validation stream the trainer cannot count)."""

    def __init__(self, num_samples: int, image_size: int, num_classes: int = 10, seed: int = 2) -> None:
        self.data = synthetic(num_samples, image_size, num_classes, seed)

    def __iter__(self):
        return iter(self.data)
