"""``trainer.profile``, typed: which steps and ranks torch.profiler records (declared in hpc_train.config.trainer)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Union


@dataclass(frozen=True)
class ProfileSettings:
    steps: Optional[List[int]]  # [first, last] global steps, inclusive; None: no profile
    ranks: Union[List[int], str]  # rank numbers, or "all"
    memory: bool  # GPUs: the allocator's history and a memory snapshot beside the trace

    def chosen(self, rank: int) -> bool:
        return self.steps is not None and (self.ranks == "all" or rank in list(self.ranks))
