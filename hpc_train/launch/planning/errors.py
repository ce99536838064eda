"""The exceptions the launch side raises once a config is accepted, and how they are shown.

A refused config (``ConfigError``) and a failed job (``JobFailed``) are families of ``hpc_train.errors``, raised
below the launch side too; JobFailed is importable here as it always was.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from hpc_train.errors import JobFailed
from hpc_train.records.rundir import EXIT_CTRL_C

__all__ = ["Forwarded", "Interrupted", "JobFailed", "StoppedWaiting"]


class Interrupted(KeyboardInterrupt):
    """Ctrl-C on the login side, said in one line: the ``hpc-train`` command prints ``str()`` and exits with
    ``exit_code``. Still a KeyboardInterrupt, so Hydra, a notebook and the Python API let it through as Ctrl-C."""

    exit_code = EXIT_CTRL_C


class StoppedWaiting(Interrupted):
    """Ctrl-C while hpc-train waited for a Slurm job (``launcher.wait``): the job goes on."""

    def __init__(self, job_id: str, run_dir: Path) -> None:
        super().__init__(job_id, run_dir)
        self.job_id, self.run_dir = job_id, run_dir

    def __str__(self) -> str:
        return (
            f"hpc-train: stopped waiting (Ctrl-C); Slurm job {self.job_id} goes on. Watch it with hpc-train-report"
            f" {self.run_dir} --watch, or stop it with scancel {self.job_id}"
        )


class Forwarded(Exception):
    """The command ran on the cluster's login node over SSH (``cluster.login``): the ``hpc-train`` command exits
    with ``exit_code``; ``refusal`` is the cluster side's refusal as data (key, problem, fix), already printed."""

    def __init__(self, exit_code: int, refusal: Optional[dict] = None) -> None:
        self.exit_code = exit_code
        self.refusal = refusal
        super().__init__(f"forwarded to the cluster (exit code {exit_code})")
