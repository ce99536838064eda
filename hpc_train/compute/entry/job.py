"""The callable submitit pickles and runs in every Slurm task.

Kept free of top-level torch imports: the login node pickles it without importing torch. On the requeue signal
training checkpoints at the next step boundary; the ranks then ask the job's outer process on the batch host to
requeue the job (hpc_train.compute.runtime.requeue) and return, and the requeued job resumes from the run dir's
newest checkpoint. submitit's own requeue (``scontrol`` from inside the task) is not used: the task may run in a
container without Slurm's commands.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Any, Dict, Optional

from omegaconf import OmegaConf

from hpc_train.compute.runtime.interrupts import REQUEUE, TrainingInterrupted
from hpc_train.compute.runtime.requeue import requeue_after_stop

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
            max_requeues = int(self.spec["trainer"]["max_requeues"])
            if stop.request == REQUEUE and requeue_after_stop(stop, self.run_dir, max_requeues):
                print(f"hpc-train: {stop}; the batch host requeues the job", file=sys.stderr, flush=True)
                return None
            raise
