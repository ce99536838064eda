"""A training step of the user's own (trainer.step): the loss plus a metric of their choice.

    hpc-train --config-dir my_conf model=tinynet data=blobs \
        'trainer.step={_target_: mynet.steps.with_top1, _partial_: true}' objective=eval_top1

hpc-train logs `top1` beside the loss (averaged over the global batch) and reports
train_top1 / eval_top1 in summary.json.
"""

import torch.nn.functional as F


def with_top1(model, batch):
    inputs, labels = batch
    logits = model(inputs)
    return {"loss": F.cross_entropy(logits, labels), "top1": (logits.argmax(dim=1) == labels).float().mean()}
