"""The callable submitit pickles and runs in every Slurm task.

Kept free of top-level torch imports: the login node pickles it without importing torch.
"""

from __future__ import annotations

from typing import Any, Dict, Optional


class TrainingJob:
    """One training job: ``TrainingJob(spec)()`` trains as this task's rank and returns rank 0's summary."""

    def __init__(self, spec: Dict[str, Any]) -> None:
        self.spec = spec

    def __call__(self) -> Optional[Dict[str, Any]]:
        from omegaconf import OmegaConf

        from hpc_train.compute.entry import train

        return train(OmegaConf.create(self.spec))
