"""A Slurm job's requeues as a follower sees them, and the one line that says each new attempt.

``launcher.wait`` and ``Job.wait()`` (hpc_train.launch.backends.slurm.follow) and ``hpc-train-report --watch``
(hpc_train.report.watch) count a job's attempts here and say each new one in the same words, once.

A new attempt is seen in the run dir's attempt log (a start per attempt since the launch: hpc_train's jobs and
script jobs write one), in Slurm's state going back to the queue (REQUEUED, or PENDING after it ran: a job without
a run dir, or one requeued before its attempt started), or, once the job ended, in accounting's record of each
attempt (``sacct -D``: REQUEUED, NODE_FAIL, PREEMPTED, ..., then the last one), which counts a requeue that fell
between two looks; nothing of that where accounting is off. A job that lost a node and runs on (``--no-kill``:
replica groups) gets a RESIZING record per change of its nodes and, for a moment, a new PENDING one: neither is an
attempt. Imports no torch.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Dict, Iterable, Optional

from hpc_train.jobs import job_states
from hpc_train.records import rundir
from hpc_train.slurm import slurm_cli

REQUEUED = frozenset({"REQUEUED", "REQUEUE_FED", "REQUEUE_HOLD"})  # only a job that was requeued is ever in these
RESIZED = "RESIZING"  # accounting's record of a job whose nodes changed (a node lost under --no-kill): it runs on
RUNNING = frozenset({"RUNNING", "COMPLETING", "CONFIGURING", "SUSPENDED", "STOPPED", RESIZED})


def requeued_line(job_id: str, attempt: int) -> str:
    return (
        f"hpc-train: job {job_id} was requeued by Slurm (attempt {attempt}); following it to the end of its last"
        " attempt"
    )


def _print(line: str) -> None:
    print(line, flush=True)


def accounted_attempts(job_ids: Iterable[str]) -> Dict[str, int]:
    """How many attempts accounting recorded for each of these jobs (one ``sacct -D`` call per IDS_PER_CALL jobs).
    Missing: accounting did not answer, or does not know the job."""
    wanted = sorted({str(j) for j in job_ids if j})
    counts: Dict[str, int] = {}
    for start in range(0, len(wanted), job_states.IDS_PER_CALL):
        batch = wanted[start : start + job_states.IDS_PER_CALL]
        asked = set(batch)
        for row in slurm_cli.sacct_answer(batch, "JobID,State", every_run=True) or []:
            if len(row) > 1 and row[0] in asked and row[1] != RESIZED:
                counts[row[0]] = counts.get(row[0], 0) + 1
    return counts


class Requeues:
    """One job's attempts after its first, each said once through `say` (default: printed).

    `run_dir`: its run dir (None: a job without one, a Hydra app's); `since`: when it was launched (a time.time():
    its attempt log's records from then on are this launch's)."""

    def __init__(self, job_id: str, run_dir: Optional[Path], since: float, say: Callable[[str], None] = _print) -> None:
        self.job_id, self.run_dir, self.since, self.say = str(job_id), run_dir, since, say
        self.count = 0  # requeues said so far
        self.last_state: Optional[str] = None  # Slurm's state at the last look that had one

    def note(self, state: Optional[str]) -> None:
        """A look at the job (`state`: Slurm's word, None when nobody answered): a new attempt is said."""
        seen = self.count
        if state == "PENDING" and self.last_state in RUNNING and self.runs_on():
            state = self.last_state  # accounting's new record of a job that lost a node and runs on, not yet started
        if (state in REQUEUED and self.last_state not in REQUEUED) or (
            state == "PENDING" and self.last_state in RUNNING
        ):  # one requeue: seen as such, or as a job back in the queue after it ran
            seen += 1
        if state is not None:
            self.last_state = state
        if self.run_dir is not None:
            seen = max(seen, rundir.attempts_started(self.run_dir, self.since) - 1)
        self._said(seen)

    def note_accounted(self, attempts: Optional[int] = None) -> None:
        """The job ended: accounting's count of its attempts (`attempts`: already asked for, with other jobs')."""
        if attempts is None:
            attempts = accounted_attempts([self.job_id]).get(self.job_id, 0)
        self._said(attempts - 1)

    def in_queue(self) -> bool:
        """Back in the queue after a requeue (where a job may wait for hours)."""
        return self.last_state == "PENDING" or self.last_state in REQUEUED

    def runs_on(self) -> bool:
        """squeue's own word that the job is running (accounting said PENDING: a job that lost a node under
        ``--no-kill`` gets a new record, pending for a moment, while it runs on)."""
        return job_states.queue_states([self.job_id]).get(self.job_id) in RUNNING

    def _said(self, seen: int) -> None:
        if seen > self.count:
            self.count = seen
            self.say(requeued_line(self.job_id, seen + 1))
