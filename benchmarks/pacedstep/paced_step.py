"""A training step that takes a known time on every attempt (trainer.step=paced_step.paced, this folder on
PYTHONPATH): the built-in computation, then BENCH_STEP_S seconds of pause. A resumed attempt, or a restarted replica
group, is paced like the first, so failures cost what they would on a real model."""

import os
import time

import torch.nn.functional as F


def paced(model, batch):
    inputs, labels = batch
    loss = F.cross_entropy(model(inputs), labels)
    time.sleep(float(os.environ.get("BENCH_STEP_S", "0.4")))
    return loss
