"""Mixed precision: an autocast context per device and a GradScaler for fp16."""

from __future__ import annotations

import contextlib
from typing import ContextManager, Optional

import torch

DTYPES = {"bf16": torch.bfloat16, "16": torch.float16}  # trainer.precision -> the low-precision dtype


def autocast(precision: str, device: torch.device) -> ContextManager:
    if precision == "32":
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=DTYPES[precision])


def grad_scaler(precision: str, device: torch.device) -> Optional["torch.amp.GradScaler"]:
    """fp16 needs loss scaling; bf16 and fp32 do not."""
    if precision != "16":
        return None
    return torch.amp.GradScaler(device.type)
