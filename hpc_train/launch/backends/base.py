"""The one interface every way of running jobs implements, and the records it hands back.

submitit's shape: a thin core and one class per backend. A backend is chosen once, by the registry
(``registry.backend_for``), from the launcher's name; every other module asks the backend, or reads the
launcher's declared kind (``config.launcher.LauncherKind``: on this machine, submits, a Slurm job, who
requeues), and never compares a launcher's name.

What a backend does, in the order a job meets it:

* ``check(plan, spec)``: what this way of running refuses, before the memory check (a wrong partition said before
  an estimate is paid for);
* ``dry_run(plan, spec)`` and ``start(plan, spec, wait)``: hpc-train's one job, after ``run.run_job`` (the
  skeleton every backend shares) made the plan and the job spec once and claimed the run dir: print what would
  run, or start the ranks here or queue the job; each returns the command's exit code.
* ``watch(job)``: the handle the Python API, the report and ``--watch`` hold on a job it started:
  ``state()`` in Slurm's words, ``cancel()``, how often to look (``poll_s``).

Slurm commands go through one command runner (``hpc_train.slurm.slurm_cli.run``) and run-dir records through
their readers (``hpc_train.records``, ``hpc_train.jobs``): the seams where a transport other than this machine
(SSH from a laptop) and a container's outer process plug in without this interface changing.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, Optional, TypeVar

from hpc_train.config.launcher import LauncherKind
from hpc_train.launch.planning.plan import RunPlan

T = TypeVar("T")


@dataclass
class JobRef:
    """A job the launch side started, as data: who runs it, where it writes, and what the watch needs.

    ``job_id``: Slurm's id (``<allocation>:<run>`` for a packed run), or ``local-<pid>[_<n>]``.
    ``process``: the hpc-train process running a local job (shared by a local sweep's jobs).
    ``sweep_index`` and ``next_run_dir``: a job of a local sweep, which has ended once the next one started.
    ``shared_states``: the states of a Slurm sweep's jobs, read together.
    """

    job_id: str
    run_dir: Path
    process: Any = None
    sweep_index: Optional[int] = None
    next_run_dir: Optional[Path] = None
    shared_states: Any = None


class JobWatch(abc.ABC):
    """A backend's handle on one job it started: its state in Slurm's words, and how to cancel it."""

    poll_s: float = 1.0  # how often a waiting caller looks again

    def __init__(self, ref: JobRef) -> None:
        self.ref = ref

    @abc.abstractmethod
    def state(self) -> str:
        """PENDING, RUNNING, COMPLETED, FAILED, CANCELLED, TIMEOUT, ... (a packed run: its allocation's words)."""

    @abc.abstractmethod
    def cancel(self) -> None:
        """Stop the job (its ranks checkpoint first where they can)."""

    def exit_code(self) -> Optional[int]:
        """The exit code of the process running the job, where there is one and it has ended."""
        return None

    def on_cluster(self, look: Callable[[], T]) -> T:
        """``look`` (a follower's look at the job) where the job's Slurm commands and records are: here, or a
        laptop's cluster over SSH (remote_watch.RemoteWatch, which reconnects)."""
        return look()

    @property
    def command_is_the_job(self) -> bool:
        """The job is a whole hpc-train command of its own, whose exit code and output are the job's (a local job
        started alone: bad input shows as the command's exit code 2, a dry run as a completed job without a summary).
        """
        return False


class Backend(abc.ABC):
    """One way of running hpc-train's jobs: local processes, a Slurm job through submitit, a plain sbatch script."""

    def __init__(self, kind: LauncherKind) -> None:
        self.kind = kind

    @property
    def name(self) -> str:
        return self.kind.name

    def check(self, plan: RunPlan, spec: Dict[str, Any]) -> None:
        """Refuse (ConfigError) what this way of running cannot take (on Slurm: the partition, the cluster's
        capacity), before the dearer checks look at the job (the memory check); nothing by default."""
        return None

    @abc.abstractmethod
    def dry_run(self, plan: RunPlan, spec: Dict[str, Any]) -> int:
        """Print what would run (the layout; on Slurm the batch script) and start nothing."""

    @abc.abstractmethod
    def start(self, plan: RunPlan, spec: Dict[str, Any], wait: bool) -> int:
        """Start the ranks here, or queue the job (following it to its end when ``wait``); the exit code."""

    @abc.abstractmethod
    def watch(self, ref: JobRef) -> JobWatch:
        """The handle on a job this backend started (the Python API's ``Job``, the report)."""
