"""Ctrl-C while jobs are being queued: what was queued is cancelled, nothing half-made stays in Slurm."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import time
from pathlib import Path
from typing import Any, ContextManager, Dict, List, Optional, Sequence, Tuple

from hpc_train.launch.planning.errors import Interrupted
from hpc_train.processes.signal_relay import handling
from hpc_train.records.rundir import RecordNotWritten
from hpc_train.slurm import slurm_cli


class SubmissionInterrupted(Interrupted):
    """Ctrl-C (SIGINT) while submit_jobs was queueing: what it had queued is cancelled, and the message says so.

    Still a KeyboardInterrupt, so code that lets Ctrl-C through (Hydra, a notebook, the Python
    API) still does; the ``hpc-train`` command and the Hydra-app launcher print its one line and
    exit with ``exit_code``.
    """

    def __init__(self, cancelled: int, total: int) -> None:
        self.cancelled, self.total = cancelled, total  # jobs cancelled; jobs the command was queueing
        super().__init__(cancelled, total)

    def __str__(self) -> str:
        what = "sweep" if self.total > 1 else "job"
        if self.total == 1:
            done = "Slurm had queued it, and it was cancelled" if self.cancelled else "it had not been queued yet"
        elif not self.cancelled:
            done = "no job had been queued yet"
        elif self.cancelled == 1:
            done = "the 1 job already queued was cancelled"
        else:
            done = f"the {self.cancelled:,} jobs already queued were cancelled"
        return (
            f"hpc-train: interrupted while queueing the {what}: {done}; nothing of the {what} is left in Slurm."
            " Run the same command to submit it again."
        )


STRAY_LOOK_AGAIN_S = 1.0  # a cut-off sbatch's request may reach the controller just after our first look


class Submission:
    """What one submit_jobs call queued and wrote, to take back whole when sbatch refuses part-way or Ctrl-C comes.

    submitit writes the pickled jobs and the script into the log folder before it calls sbatch
    and prints sbatch's stderr itself; both would outlive a refusal and mislead a later look or
    resume. A sweep cut into several arrays may be refused at its third: the arrays already
    queued are cancelled (scancel) so the sweep goes in whole or not at all. Ctrl-C reaches the
    sbatch under way too (the terminal signals its whole process group): Slurm may have made
    that job though submitit never read its id, so it is looked up by its script (see
    ``_stray_jobs``) and cancelled with the rest.
    """

    def __init__(self) -> None:
        self.queued: List[str] = []  # Slurm job ids (array ids) in submission order
        self.jobs = 0  # how many jobs (array tasks) those ids hold
        self.in_flight = 0  # jobs of the sbatch call under way, whose id is not in `queued` yet (0: none)
        self._before: Dict[Path, Optional[set]] = {}  # folder -> its entries before this call (None: absent)

    def watch(self, folder: Path) -> None:
        """Note what submitit's folder holds before this call (a folder named with %j: its first fixed parent)."""
        from submitit.core.utils import JobPaths  # submitit (~50 ms): only to submit

        folder = JobPaths.get_first_id_independent_folder(folder)
        if folder not in self._before:
            self._before[folder] = set(folder.iterdir()) if folder.exists() else None

    def sending(self, jobs: int) -> None:
        self.in_flight = jobs

    def sent(self, job_id: str, jobs: int) -> None:
        self.queued.append(job_id)
        self.jobs += jobs
        self.in_flight = 0

    def take_back(self) -> int:
        """Cancel what this call queued and remove the files it wrote; returns how many jobs were cancelled.

        A second Ctrl-C meanwhile is ignored (by scancel and squeue too): half a clean-up would
        leave part of the sweep queued.
        """
        with _ctrl_c_ignored():
            new = self._new_entries()
            strays = _stray_jobs(new, self.queued) if self.in_flight else []
            if self.queued or strays:
                slurm_cli.run(["scancel", *self.queued, *strays])
            for path in new:
                shutil.rmtree(path) if path.is_dir() and not path.is_symlink() else path.unlink(missing_ok=True)
            for folder, before in self._before.items():
                if before is None and folder.exists() and not any(folder.iterdir()):
                    folder.rmdir()
        return self.jobs + (self.in_flight if strays else 0)

    def _new_entries(self) -> List[Path]:
        return [
            path
            for folder, before in self._before.items()
            for path in (set(folder.iterdir()) if folder.exists() else set()) - (before or set())
        ]


class Queueing:
    """Ctrl-C from the first sbatch until the jobs are written down (job specs, jobs.tsv) cancels them all.

    submit_jobs takes back what it queued when Ctrl-C comes while it queues; the writing after it
    is part of queueing too, or Ctrl-C there would leave jobs queued that no job table lists. So
    a Ctrl-C meanwhile waits for the writing to end, then cancels every job of `submitted`.
    """

    def __init__(self, total: int) -> None:
        self.total = total
        self.submitted: List[Tuple[Any, Any]] = []  # submit_jobs' (job, handle) pairs, once it returned

    def __enter__(self) -> "Queueing":
        self._ctrl_c = CtrlC()
        return self

    def __exit__(self, kind: Any, error: Any, trace: Any) -> bool:
        self._ctrl_c.restore()
        if isinstance(error, RecordNotWritten) and self.submitted:  # a full disk under jobs.tsv: none runs unlisted
            with _ctrl_c_ignored():
                slurm_cli.run(["scancel", *sorted({str(handle.job_id).split("_")[0] for _, handle in self.submitted})])
            raise RecordNotWritten(f"{error} The {len(self.submitted)} job(s) just queued were cancelled.") from None
        if kind is None and self._ctrl_c.count and self.submitted:
            with _ctrl_c_ignored():
                slurm_cli.run(["scancel", *sorted({str(handle.job_id).split("_")[0] for _, handle in self.submitted})])
            raise SubmissionInterrupted(len(self.submitted), self.total)
        return False


class CtrlC:
    """Ctrl-C while queueing takes effect between sbatch calls, never inside submitit's code (a KeyboardInterrupt
    there leaves half-built job objects whose finalizers print tracebacks at exit). The sbatch under way gets the
    terminal's SIGINT itself; a second Ctrl-C interrupts at once. Outside the main thread Python's own handling
    stays."""

    def __init__(self) -> None:
        self.count = 0
        self._handling = contextlib.ExitStack()
        self._handling.enter_context(handling([signal.SIGINT], self._pressed))

    def _pressed(self, signum: int, frame: Any) -> None:
        self.count += 1
        if self.count > 1:
            raise KeyboardInterrupt

    def take_effect(self) -> None:
        if self.count:
            raise KeyboardInterrupt

    def restore(self) -> None:
        self._handling.close()  # a second call does nothing


def _ctrl_c_ignored() -> ContextManager[bool]:
    """SIGINT ignored inside (in the main thread; elsewhere Python delivers it to the main thread anyway)."""
    return handling([signal.SIGINT], signal.SIG_IGN)


def _stray_jobs(new_files: Sequence[Path], known: Sequence[str]) -> List[str]:
    """Ids of the user's queued jobs whose batch script is one this call wrote, other than `known`.

    An sbatch cut off by Ctrl-C may have made its job without printing the id. The script path
    (submitit's ``.submission_file_<uuid>.sh``, new in the submission folder since this call
    began) names that one call, where the job name or the log folder would also match the user's
    other jobs (an earlier sweep of the same name, a resume into the same folder). Slurm keeps it
    as squeue's command (``%o``), made absolute. Looked at twice, a moment apart, when the first
    look finds nothing.
    """
    scripts = {os.path.realpath(path) for path in new_files if path.name.endswith(".sh")}
    for attempt in range(2):
        if attempt:
            time.sleep(STRAY_LOOK_AGAIN_S)
        listing = slurm_cli.query(["squeue", "--me", "-h", "-o", "%F %o"]) or ""
        found = {
            job
            for job, _, command in (line.strip().partition(" ") for line in listing.splitlines())
            if job and job not in known and os.path.realpath(command) in scripts
        }
        if found:
            return sorted(found)
    return []
