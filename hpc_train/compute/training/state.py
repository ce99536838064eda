"""Where the training loop is: the position and last results a checkpoint carries and a resume restores."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Dict, Optional


@dataclass
class TrainState:
    """Where the loop is; checkpointed (as ``state``) and restored like any other state holder.

    A ``torch.distributed.checkpoint.stateful.Stateful`` by its methods: that class is a runtime-checkable
    Protocol, so DCP and the Checkpointer's annotations accept it without subclassing, and the import (about a
    second per rank) is left to the runs that write DCP checkpoints."""

    epoch: int = 0  # epoch in progress
    step_in_epoch: int = 0  # optimizer steps already taken in that epoch
    global_step: int = 0
    last_loss: Optional[float] = None
    last_metrics: Dict[str, float] = field(default_factory=dict)  # the user step's other metrics, last logged
    last_eval: Optional[Dict[str, Any]] = field(default=None)

    def state_dict(self) -> Dict[str, Any]:
        return asdict(self)

    def step_taken(self) -> None:
        self.global_step += 1
        self.step_in_epoch += 1

    def next_epoch(self) -> None:
        self.epoch, self.step_in_epoch = self.epoch + 1, 0

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        for name, value in state.items():
            setattr(self, name, value)
