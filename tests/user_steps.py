"""Training steps for the tests (trainer.step=tests.user_steps.NAME): one exactly like the built-in step, and
the broken ones the start-of-job check must refuse."""

import torch.nn.functional as F


def cross_entropy(model, batch):
    """The built-in step written as a user would: same operations, so bit-identical weights."""
    inputs, labels = batch
    return F.cross_entropy(model(inputs), labels)


def raises(model, batch):
    return model(**batch)  # (input, target) pairs are a tuple: TypeError


def per_sample_loss(model, batch):
    inputs, labels = batch
    return F.cross_entropy(model(inputs), labels, reduction="none")


def no_loss_key(model, batch):
    inputs, labels = batch
    return {"total": F.cross_entropy(model(inputs), labels)}
