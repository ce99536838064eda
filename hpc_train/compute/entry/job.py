"""The callable submitit pickles and runs in every Slurm task.

Kept free of top-level torch imports: the login node pickles it without importing torch.
It implements submitit's checkpoint protocol: on the requeue signal, training checkpoints at
the next step boundary, then rank 0 lets submitit call :meth:`TrainingJob.checkpoint`, which
returns the same job (it resumes from the run dir's newest checkpoint), and requeue it.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Dict, Optional

import submitit
from omegaconf import OmegaConf

from hpc_train.compute.runtime.interrupts import REQUEUE, TrainingInterrupted
from hpc_train.compute.runtime.requeue import requeue_after_stop, requeue_allowed

log = logging.getLogger("hpc_train")


class TrainingJob:
    """One training job: ``TrainingJob(spec)()`` trains as this task's rank and returns rank 0's summary."""

    def __init__(self, spec: Dict[str, Any]) -> None:
        self.spec = spec

    @property
    def run_dir(self) -> Path:
        return Path(self.spec["job"]["run_dir"])

    def __call__(self) -> Optional[Dict[str, Any]]:
        from hpc_train.compute.entry.train import train  # torch: the login node imports this class to pickle it

        try:
            return train(OmegaConf.create(self.spec))
        except TrainingInterrupted as stop:
            if stop.request == REQUEUE:
                requeue_after_stop(stop, self.run_dir, int(self.spec["trainer"]["max_requeues"]))
            raise

    def checkpoint(self, *args: Any, **kwargs: Any) -> Optional[Any]:
        """submitit's hook: what to run after the requeue (None: do not requeue)."""
        if not requeue_allowed(self.run_dir, int(self.spec["trainer"]["max_requeues"])):
            return None
        return submitit.helpers.DelayedSubmission(TrainingJob(self.spec))
