"""``scontrol requeue`` a running job from inside it, optionally away from some nodes (the batch host's act)."""

from __future__ import annotations

import time
from typing import List, Tuple

from hpc_train.slurm import slurm_cli
from hpc_train.slurm.hostlist import expand_hostlist

UPDATE_TRIES = 10


def excluded(job: str) -> List[str]:
    """The job's ExcNodeList today, as node names (Slurm's compressed form expanded)."""
    value = slurm_cli.show_job(job).get("ExcNodeList", "")
    return [] if value in ("", "(null)") else expand_hostlist(value)


def requeue_job(job: str, exclude: List[str]) -> Tuple[bool, str]:
    """``scontrol requeue``, then (while Slurm holds the requeued job back) add `exclude` to its ExcNodeList; (done,
    what was done in words).

    A running job's ExcNodeList cannot be changed; a requeued one is pending as soon as the requeue is answered, and
    waits at least Slurm's credential lifetime before it may start again, which leaves the update time to land. Both
    commands run inside the job that the requeue ends: they hold off the SIGTERM it brings (see slurm_cli.run).
    """
    before = excluded(job) if exclude else []
    done = slurm_cli.run(["scontrol", "requeue", job], hold_sigterm=True)
    if done.returncode != 0:
        return False, f"not requeued: scontrol requeue {job} failed: {slurm_cli.said(done)}"
    if not exclude:
        return True, f"requeued job {job}"
    nodes = ",".join(sorted(set(before) | set(exclude)))
    for _ in range(UPDATE_TRIES):  # a controller that is busy or restarting may fail one for a moment
        update = slurm_cli.run(["scontrol", "update", f"JobId={job}", f"ExcNodeList={nodes}"], hold_sigterm=True)
        if update.returncode == 0:
            break
        time.sleep(0.5)
    else:
        return True, f"requeued job {job}, but could not exclude {','.join(exclude)}: {slurm_cli.said(update)}"
    return True, f"requeued job {job} once, excluding node {','.join(exclude)} (--exclude={nodes})"
