"""The training step of a language model, for trainer.step: the next-token loss, and how many tokens it covered, so
that hpc_train reports tokens per second beside samples per second."""

from typing import Any, Dict

import torch

from llama.loss import next_token_loss


def next_token_step(model: torch.nn.Module, batch: Any) -> Dict[str, torch.Tensor]:
    ids, targets = batch
    logits = model(ids)
    return {"loss": next_token_loss(logits, targets.to(logits.device)), "tokens": torch.tensor(float(targets.numel()))}
