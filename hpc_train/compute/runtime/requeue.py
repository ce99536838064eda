"""After a stop signal and a checkpoint: ask the batch host to requeue the job into the same run dir, or not.

The ranks never run ``scontrol`` themselves (inside a container there is none): rank 0 checks
``trainer.max_requeues`` (:func:`requeue_allowed`) and writes the request (hpc_train.records.job_requests); the
other ranks wait until it is written, then every rank exits; the job's outer process on the batch host
(hpc_train.batchhost.agent) runs ``scontrol requeue`` once the step has ended. A packed run's allocation pool
requeues its allocation itself. A crash (an exception) is never requeued.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from hpc_train.compute.runtime.interrupts import TrainingInterrupted
from hpc_train.compute.runtime.ranks import detect_ranks
from hpc_train.pack.records import PACKED_ENV
from hpc_train.records import job_requests, rundir

log = logging.getLogger("hpc_train")

WAIT_FOR_REQUEST_S = 120.0


def requeue_allowed(run_dir: Path, max_requeues: int) -> bool:
    """True while the attempts so far leave room for one more (attempt n+1 needs n <= max_requeues)."""
    started = rundir.attempts_started(run_dir)
    if started > max_requeues:
        log.error(
            "not requeuing: %d attempts already, trainer.max_requeues=%d. The checkpoint is kept: %s, or raise"
            " trainer.max_requeues.",
            started,
            max_requeues,
            rundir.resume_hint(run_dir),
        )
        return False
    return True


def requeue_after_stop(stop: TrainingInterrupted, run_dir: Path, max_requeues: int) -> bool:
    """After a requeue signal's checkpoint: True when the batch host has been asked to requeue the job (by rank 0;
    the other ranks wait until it has), so every rank may leave as a success.

    False: not requeued (no batch host listens: a local run, or a packed run whose pool requeues), and the caller
    exits as interrupted (the checkpoint is kept either way).
    """
    if os.environ.get(PACKED_ENV):
        return False
    if job_requests.request_file() is None:
        if os.environ.get("SLURM_JOB_ID") and detect_ranks().is_main:  # a batch script of the user's own
            log.error(
                "not requeued: no batch-host agent started this job step; exec `python -m hpc_train.batchhost.agent"
                " --requests DIR -- srun ...` in the batch script (as sbatch/*.slurm do) to requeue it"
            )
        return False
    if not detect_ranks().is_main:  # rank 0 decides; exiting before it has written would end the step first
        return job_requests.wait_for(WAIT_FOR_REQUEST_S)
    if not requeue_allowed(run_dir, max_requeues):
        return False
    return job_requests.write(job_requests.REQUEUE, why=stop.reason)
