"""One batch through a torch.distributed.pipelining schedule, as every pipelined strategy runs it.

``pipeline`` with ``strategy.engine=pipelining`` and a ``mesh`` with a pp dimension each build a
schedule over this rank's stage; a rank then steps it with what its stage holds: the first stage
the inputs, the last the targets (and it collects the micro-batches' losses), a middle stage
nothing (its activations arrive and leave by point-to-point messages).
"""

from __future__ import annotations

from typing import Any, List

import torch

from hpc_train.compute.parallel.precision import autocast
from hpc_train.compute.runtime import heartbeat
from hpc_train.records import hang


def schedule_step(
    schedule: Any,
    inputs: torch.Tensor,
    labels: torch.Tensor,
    is_first: bool,
    is_last: bool,
    precision: str,
    device: torch.device,
) -> List[torch.Tensor]:
    """Step `schedule` over one batch from this rank's stage; the micro-batches' losses (the last stage's; empty on
    the others)."""
    heartbeat.mark(hang.FORWARD_BACKWARD)  # the schedule interleaves both, with sends and receives
    losses: List[torch.Tensor] = []
    with autocast(precision, device):
        if is_first and is_last:
            schedule.step(inputs, target=labels.to(device), losses=losses)
        elif is_first:
            schedule.step(inputs)
        elif is_last:
            schedule.step(target=labels.to(device), losses=losses)
        else:
            schedule.step()
    return losses
