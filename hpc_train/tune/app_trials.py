"""A trial's rung as a job of any Hydra app: launched by the app's own Hydra launcher, hpc_train's
(``hydra/launcher=hpc_train_local`` on this machine, ``hpc_train_slurm`` on Slurm, packed or not), without waiting.

The rung is job number n of the sweep (n: the trial's number), so its output dir is ``<sweep dir>/<n>``, the same
for every rung of the trial: an app that keeps its state there resumes it when promoted. Its state is read from the
sweep's own records as ``hpc-train-report`` reads them (hpc_train.report.app_report: the job table, the
submission records, Slurm's or the process's state); its objective is the last value the app reported with
``hpc_train.report_objective(step, value)`` in that dir.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

from hydra.core.utils import JobStatus

from hpc_train.errors import ConfigError, JobFailed
from hpc_train.jobs import job_table
from hpc_train.jobs.job_states import ENDED
from hpc_train.launch.hydra.app_launcher import AppLauncher
from hpc_train.records.metrics_log import last_objective
from hpc_train.report import app_report
from hpc_train.tune.trials import DONE, FAILED, LOST, RUNNING, Look


class AppTrials:
    resumes = True  # each rung runs in the trial's dir, where an app that keeps its state resumes it

    def __init__(self, launcher: Any, sweep_dir: Path) -> None:
        if not isinstance(launcher, AppLauncher):
            name = type(launcher).__name__
            raise ConfigError(
                "hydra/launcher",
                f"the adaptive sweeper starts each rung as a job of its own and follows it, which {name} cannot do"
                " (it runs a batch of jobs and returns when all have ended).",
                "add hydra/launcher=hpc_train_local (this machine) or hydra/launcher=hpc_train_slurm (Slurm).",
            )
        self.launcher, self.sweep_dir = launcher, Path(sweep_dir)

    def start(self, overrides: Sequence[str], run_dir: Path) -> str:
        """The rung queued (or started here) as job number `run_dir`'s name; its job id."""
        returns = self.launcher.launch([list(overrides)], initial_job_idx=int(run_dir.name))
        result = returns[0]
        if result.status == JobStatus.FAILED:
            raise JobFailed(f"the rung was not started: {result._return_value}", run_dir=run_dir)
        return str(result.return_value)

    def look(self, job_id: Optional[str], run_dir: Path, since: float) -> Look:
        row = self._rows().get(run_dir.name)
        if job_id is None:  # its controller stopped before noting it: the sweep's records say whether it started
            return Look(LOST) if row is None else self.look(str(row["job_id"]), run_dir, since)
        if row is None or row["job_id"] != job_id:  # the launch records each job before it returns its id
            table = job_table.path_of(self.sweep_dir)
            return Look(
                FAILED, error=f"job {job_id} of trial {run_dir.name} is not the newest job {run_dir.name} of {table}"
            )
        state = str(row["state"])
        if state == "COMPLETED":
            return Look(DONE)
        if state in ENDED or state.startswith("CANCELLED"):
            return Look(FAILED, error=f"job {row['job_id']} {state}: {row.get('result')} (its log: {row.get('log')})")
        return Look(RUNNING)

    def cancel(self, job_ids: List[str]) -> None:
        """A Hydra app's jobs are left to end on their own (scancel them by id from the sweep's jobs.tsv)."""

    def close(self) -> None:
        """The study ended: nothing to close (each rung was its own job)."""

    def _rows(self) -> Dict[str, Dict[str, Any]]:
        return {str(row["job"]): row for row in app_report.rows(self.sweep_dir)}


def reported_value(run_dir: Path) -> float:
    """The rung's objective: the last value the app reported in its dir (JobFailed naming the call when none)."""
    found = last_objective(run_dir)
    if found is None:
        raise JobFailed(
            f"the job in {run_dir} reported no objective. Fix: call hpc_train.report_objective(step, value) in the"
            " app (rank 0; at least once per rung).",
            run_dir=run_dir,
        )
    return found[1]
