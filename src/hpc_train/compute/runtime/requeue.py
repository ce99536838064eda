"""After a stop signal and a checkpoint: requeue the job into the same run dir, or not.

Under submitit, rank 0 hands over to submitit's own handler, which calls
``TrainingJob.checkpoint()`` and runs ``scontrol requeue``; in a plain sbatch script rank 0
runs ``scontrol requeue`` itself. Either way ``trainer.max_requeues`` bounds the number of
requeues (timeouts and preemptions alike) and the other ranks wait to be stopped by Slurm.
A crash (an exception) is never requeued.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

from hpc_train import rundir

log = logging.getLogger("hpc_train")

WAIT_FOR_REQUEUE_S = 120.0


def requeue_allowed(run_dir: Path, max_requeues: int) -> bool:
    """True while the attempts so far leave room for one more (attempt n+1 needs n <= max_requeues)."""
    started = rundir.attempts_started(run_dir)
    if started > max_requeues:
        log.error(
            "not requeuing: %d attempts already, trainer.max_requeues=%d. The checkpoint is kept: "
            "re-run the same command (same hydra.run.dir) to continue, or raise trainer.max_requeues.",
            started,
            max_requeues,
        )
        return False
    return True


def wait_to_be_requeued() -> None:
    """Non-zero ranks: rank 0 is requeueing the job, which stops every task; do not exit first."""
    deadline = time.monotonic() + WAIT_FOR_REQUEUE_S
    while time.monotonic() < deadline:
        time.sleep(1.0)
    log.error("rank 0 did not requeue the job within %.0f s; exiting", WAIT_FOR_REQUEUE_S)
