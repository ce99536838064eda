"""How the controller runs a trial's rung and looks at it: an hpc-train job per rung, submitted as
:func:`hpc_train.submit` submits (locally a background process, on Slurm a queued job, packed, or from a laptop over
SSH: the launcher in the overrides decides), into the trial's run dir, so that a promoted trial resumes its checkpoint.

A look says whether the rung's job runs, ended with a summary, failed (with its error), or was lost: a local job
adopted from an earlier controller (its process is not this one's child) that ended without finishing its rung, which
the controller runs again (it resumes its checkpoint). A local job's liveness then comes from its run dir's claim,
which its rank 0 keeps fresh (hpc_train.records.run_claim).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from hpc_train import api
from hpc_train.config.launcher import launcher_kind
from hpc_train.errors import HpcTrainError
from hpc_train.jobs.submissions import SUBMISSIONS, newest_submission
from hpc_train.records import run_claim
from hpc_train.records.metrics_log import reported_values
from hpc_train.records.rundir import SUMMARY, read_attempts

RUNNING, DONE, FAILED, LOST = "running", "done", "failed", "lost"


@dataclass(frozen=True)
class Look:
    state: str  # RUNNING, DONE, FAILED or LOST
    error: Optional[str] = None  # FAILED: why


class HpcTrainTrials:
    def __init__(
        self, launcher: str, config_dir: Optional[str] = None, objective: Optional[str] = None, resumes: bool = True
    ) -> None:
        self.launcher = launcher
        self.config_dir = config_dir
        self.objective = objective  # the summary key a rung is ranked by
        # False: a rung cannot resume its trial's last (a script job without script.resume_args), so the scheduler's
        # stopping form runs each trial's full budget in one job, judged at each rung as its reports reach it
        self.resumes = resumes
        self._jobs: Dict[str, api.Job] = {}  # started by this controller

    def start(self, overrides: Sequence[str], run_dir: Path) -> str:
        """The rung's job, started (ConfigError for bad input, as hpc_train.submit raises it)."""
        job = api.submit(list(overrides), self.config_dir, run_dir)
        self._jobs[job.job_id] = job
        return job.job_id

    def look(self, job_id: Optional[str], run_dir: Path, since: float) -> Look:
        """The rung's job now; `since`: when it was started. `job_id` None: the controller that started the rung
        stopped before it noted the job: a job found in the run dir's records since then is that job."""
        job = self._jobs.get(job_id) if job_id else None
        if job is None and not launcher_kind(self.launcher).submits:
            return _adopted_local(run_dir, since)
        if job is None:
            job_id = job_id or _submitted_since(run_dir, since)
            if job_id is None:
                return Look(LOST)
            job = self._jobs[job_id] = api.Job(job_id, run_dir, self.launcher, started=since)
        try:
            job.wait(timeout=0)
        except TimeoutError:
            return Look(RUNNING)
        except HpcTrainError as err:
            return Look(FAILED, error=str(err))
        return Look(DONE)

    def reported(self, run_dir: Path, since: float) -> List[Tuple[int, float, float]]:
        """(step, value, time) of each objective the rung's job has reported so far (since `since`)."""
        return reported_values(run_dir, self.objective, since - 1.0)

    def cancel(self, job_ids: List[str]) -> None:
        for job_id in job_ids:
            job = self._jobs.get(job_id)
            if job is not None:
                job.cancel()

    def close(self) -> None:
        """The study ended: nothing to close (each rung was its own job)."""


def _submitted_since(run_dir: Path, since: float) -> Optional[str]:
    """The Slurm job submitted into `run_dir` since `since` (its submission record), if any."""
    path = run_dir / SUBMISSIONS
    if not path.exists() or path.stat().st_mtime < since - 1.0:
        return None
    newest = newest_submission(run_dir)
    return str(newest["job_id"]) if newest else None


def _adopted_local(run_dir: Path, since: float) -> Look:
    claim = run_claim.read(run_dir)
    if claim is not None and run_claim.liveness(claim)[0]:
        return Look(RUNNING)
    summary_file = run_dir / SUMMARY
    if summary_file.exists() and summary_file.stat().st_mtime >= since - 1.0:
        return Look(DONE)
    return Look(LOST)


def began(run_dir: Path, since: float) -> float:
    """When the run's first attempt since `since` started (its start record); `since` without one."""
    starts = [float(r.get("time", 0.0)) for r in read_attempts(run_dir) if r.get("event") == "start"]
    return next((at for at in starts if at >= since), since)


def ran_for(run_dir: Path, since: float) -> float:
    """Seconds the run's attempts started since `since` ran (start to end, a requeue's attempts added up): what the
    rung's job cost, its wait in the queue left out. Without an attempt record, the seconds since `since`."""
    records = read_attempts(run_dir)
    total, begun = 0.0, None
    for record in records:
        at = float(record.get("time", 0.0))
        if record.get("event") == "start" and at >= since:
            begun = at
        elif record.get("event") == "end" and begun is not None:
            total, begun = total + at - begun, None
    return total if total > 0 else time.time() - since
