"""A training step that takes a known time (trainer.step=tests.support.paced_steps.paced): the built-in computation,
then a
pause, so a test can act while a run is surely still training."""

import time

import torch.nn.functional as F

PAUSE_S = 0.2


def paced(model, batch):
    inputs, labels = batch
    loss = F.cross_entropy(model(inputs), labels)
    time.sleep(PAUSE_S)
    return loss
