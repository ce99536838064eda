"""The total gradient norm and clipping to it, on every torch the project supports.

torch >= 2.6 splits ``clip_grad_norm_`` into ``get_total_norm`` and ``clip_grads_with_norm_``,
which lets a strategy turn this rank's norm into the whole model's (FSDP2's DTensor norm made
whole with ``full_tensor``, the pipelining engine's stages combined) before clipping, as
torchtitan does. Older torch gets the same arithmetic written out.
"""

from __future__ import annotations

from typing import List, Sequence

import torch
import torch.nn as nn


def total_norm(grads: Sequence[torch.Tensor], device: torch.device) -> torch.Tensor:
    """The L2 norm of all `grads` together (0 when there are none)."""
    grads = list(grads)
    if not grads:
        return torch.zeros((), device=device)
    if hasattr(nn.utils, "get_total_norm"):
        return nn.utils.get_total_norm(grads, 2.0)
    first = grads[0].device
    return torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g, 2.0).to(first) for g in grads]), 2.0)


def clip_to_norm(params: List[torch.Tensor], max_norm: float, norm: torch.Tensor) -> None:
    """Scale the gradients of `params`, whose total norm is `norm`, so that it becomes at most `max_norm`."""
    if not params:
        return
    if hasattr(nn.utils, "clip_grads_with_norm_"):
        nn.utils.clip_grads_with_norm_(params, max_norm, norm)
        return
    coefficient = torch.clamp(max_norm / (norm + 1e-6), max=1.0)
    for param in params:
        param.grad.mul_(coefficient.to(param.grad.device))
