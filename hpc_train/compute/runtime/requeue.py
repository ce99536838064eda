"""After a stop signal and a checkpoint: requeue the job into the same run dir, or not.

One path for both ways a job runs on Slurm (:func:`requeue_after_stop`): under submitit, rank 0
hands over to submitit's own handler, which asks ``TrainingJob.checkpoint()`` (that is,
:func:`requeue_allowed`) and runs ``scontrol requeue``; in a plain sbatch script rank 0 asks
:func:`requeue_allowed` and runs ``scontrol requeue`` itself. Either way ``trainer.max_requeues``
bounds the number of requeues (timeouts and preemptions alike) and the other ranks wait to be
stopped by Slurm. A crash (an exception) is never requeued.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

from hpc_train.compute.runtime.interrupts import TrainingInterrupted
from hpc_train.compute.runtime.ranks import detect_ranks
from hpc_train.pack.records import PACKED_ENV
from hpc_train.records import rundir
from hpc_train.records.run_claim import slurm_job_id
from hpc_train.slurm import slurm_cli

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


def requeue_self() -> bool:
    """``scontrol requeue`` this job (an array task by its own id); False outside Slurm or when it fails."""
    job = slurm_job_id()
    if not job:
        return False
    proc = slurm_cli.run(["scontrol", "requeue", job], hold_sigterm=True)  # the requeue SIGTERMs the job, scontrol too
    if proc.returncode != 0:
        log.error("scontrol requeue %s failed: %s", job, proc.stderr.strip())
        return False
    return True


def requeue_after_stop(stop: TrainingInterrupted, run_dir: Path, max_requeues: int) -> bool:
    """After a requeue signal's checkpoint: True when rank 0 has requeued the job itself.

    Under submitit its handler requeues (or not, through ``TrainingJob.checkpoint``) and ends the
    process; other ranks wait for Slurm to stop them. False: not requeued, the caller exits as
    interrupted (the checkpoint is kept either way).
    """
    if os.environ.get(PACKED_ENV):  # a packed run: its allocation's pool requeues, once every running run is out
        return False
    if not detect_ranks().is_main:
        wait_to_be_requeued()
        return False
    handler = stop.flag.submitit_handler()
    if handler is not None:
        # submitit: checkpoint(), dump the new submission, scontrol requeue, exit; it raises
        # UncompletedJobError instead when checkpoint() says not to requeue.
        handler(stop.flag.requeue_signal, None)
        return False
    return requeue_allowed(run_dir, max_requeues) and requeue_self()
