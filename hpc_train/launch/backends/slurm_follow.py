"""Following a submitted Slurm job to the end of its last attempt (``launcher.wait``, a sweeper that reads results,
the Hydra app launcher), without submitit's own wait; ``follow_job`` reports how it ended and gives the exit code.

submitit's ``Job.results()`` takes the first result file it finds for the job's end and asks ``sacct`` on every
poll; neither holds on a real cluster:

* A job that Slurm requeued (``scontrol requeue`` from outside, a preemption with ``PreemptMode=REQUEUE``, a node
  failure under ``--requeue``, or the job itself on its time limit) leaves the result file of the attempt that was
  stopped (a failure) while the job goes on. Here a failure result is the job's end only once Slurm (or, without
  accounting, the run dir) says the job ended; a later attempt's result replaces it.
* Where accounting is off, every submitit poll printed its sacct warning (three copies through two handlers) and
  sacct's own "accounting storage is disabled". Here states come from ``hpc_train.jobs.job_states`` (squeue, then
  the run dir's records), and that accounting does not answer is said once per process.

One line says that a job was requeued (per new attempt: its attempt log, Slurm's state going back to the queue, or,
once it ended, accounting's record of each attempt); the caller reports how the last attempt ended.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from hpc_train.jobs import job_states
from hpc_train.launch.backends.run import report_summary
from hpc_train.launch.planning.errors import StoppedWaiting
from hpc_train.records import hang, rundir
from hpc_train.records.rank_errors import refusal_words
from hpc_train.slurm import slurm_cli

RESULT_POLL_S = 1.0  # how often the result file is looked at (a file test)
STATE_POLL_S = 5.0  # how often Slurm is asked while no result says the attempt failed (a job that ended without one)
UNKNOWN_GRACE_S = 30.0  # nobody lists the job (no accounting, no run dir to read): how long before it counts as ended
_REQUEUED = frozenset({"REQUEUED", "REQUEUE_FED", "REQUEUE_HOLD"})  # only a job that was requeued is ever in these
_RUNNING = frozenset({"RUNNING", "COMPLETING", "CONFIGURING", "SUSPENDED", "STOPPED"})


class _Said:
    accounting_silent = False  # said once per process: a sweep follows many jobs


def say_accounting_silent() -> None:
    if not _Said.accounting_silent:
        _Said.accounting_silent = True
        print(f"hpc-train: {job_states.FROM_RUN_DIRS}", flush=True)


class NoResult(RuntimeError):
    """A job that ended without a result file (cancelled, killed, out of time or memory, a node lost)."""


@dataclass
class Ending:
    """How a followed job ended: its result (None: it completed), or why not."""

    error: Optional[BaseException]  # the last attempt's failure as submitit raises it; None when it completed
    state: Optional[str]  # Slurm's (or the run dir's) final word; None when nobody knows the job any more
    detail: Optional[str] = None  # the run dir's one-line reason, when there was no result file
    requeues: int = 0


class _Follower:
    def __init__(self, handle: Any, run_dir: Optional[Path], since: float) -> None:
        self.handle, self.run_dir, self.since = handle, run_dir, since
        self.job_id = str(handle.job_id)
        self.result = Path(handle.paths.result_pickle)
        self.requeues = 0
        self.last_state: Optional[str] = None
        self.unknown_since: Optional[float] = None

    def state(self) -> Optional[job_states.SlurmState]:
        found = job_states.slurm_job_states(
            [self.job_id], {self.job_id: self.run_dir} if self.run_dir is not None else None
        ).get(self.job_id)
        if found is not None and found.from_run_dir:
            say_accounting_silent()
        self.note_requeue(found.state if found is not None else None)
        return found

    def note_accounted_requeues(self) -> None:
        """The job ended: Slurm's accounting keeps a record per attempt (``sacct -D``: REQUEUED, NODE_FAIL, PREEMPTED,
        ..., then the last one), so a requeue the polls missed (all of it between two) is counted and said now;
        nothing where accounting is off."""
        rows = slurm_cli.sacct_answer([self.job_id], "JobID,State", every_run=True) or []
        self.say_requeues(sum(1 for row in rows if row and row[0] == self.job_id) - 1)

    def say_requeues(self, seen: int) -> None:
        if seen > self.requeues:
            self.requeues = seen
            print(
                f"hpc-train: job {self.job_id} was requeued by Slurm (attempt {seen + 1}); following it to the end of"
                " its last attempt",
                flush=True,
            )

    def note_requeue(self, state: Optional[str]) -> None:
        """One line per attempt after the first: the run dir's attempt log counts them (hpc_train's jobs and script
        jobs write one), Slurm's states count them where there is none (REQUEUED, or PENDING again after it ran)."""
        seen = self.requeues
        if (state in _REQUEUED and self.last_state not in _REQUEUED) or (
            state == "PENDING" and self.last_state in _RUNNING
        ):  # one requeue: seen as such, or as a job back in the queue after it ran
            seen += 1
        if state is not None:
            self.last_state = state
        if self.run_dir is not None:
            seen = max(seen, rundir.attempts_started(self.run_dir, self.since) - 1)
        self.say_requeues(seen)

    def read_result(self) -> Optional[BaseException]:
        """The result file's outcome: None for success, else submitit's exception (the file exists: no sacct call)."""
        try:
            self.handle.results()
            return None
        except Exception as err:
            return err

    def follow(self) -> Ending:
        next_state_at = time.monotonic() + STATE_POLL_S
        failure: Optional[BaseException] = None
        read_at: Optional[float] = None  # the result file's mtime when it was last read
        while True:
            fresh = False
            if self.result.exists() and self.result.stat().st_mtime != read_at:  # new or rewritten: read it once
                read_at, fresh = self.result.stat().st_mtime, True
                failure = self.read_result()
                if failure is None:
                    self.note_requeue(None)
                    self.note_accounted_requeues()
                    return Ending(None, "COMPLETED", requeues=self.requeues)
            # a failed attempt: has the job ended? Asked every RESULT_POLL_S, but only every STATE_POLL_S once it is
            # back in the queue (a requeued job may wait there for hours)
            waiting = self.last_state == "PENDING" or self.last_state in _REQUEUED
            if fresh or (failure is not None and not waiting) or time.monotonic() >= next_state_at:
                next_state_at = time.monotonic() + STATE_POLL_S
                found = self.state()
                if found is not None and found.state in job_states.ENDED:
                    return self.ended(found)
                if found is None:
                    self.unknown_since = self.unknown_since or time.monotonic()
                    if failure is not None or time.monotonic() - self.unknown_since > UNKNOWN_GRACE_S:
                        gone = "neither squeue nor sacct knows it any more"
                        return Ending(
                            failure or NoResult(f"Slurm job {self.job_id}: {gone}"), None, gone, self.requeues
                        )
                else:
                    self.unknown_since = None
            time.sleep(RESULT_POLL_S)

    def ended(self, found: job_states.SlurmState) -> Ending:
        """The job ended: the last attempt's result file says how (read again: it may be newer than the one that
        was there a moment ago); without one, Slurm's state and the run dir's reason."""
        self.note_accounted_requeues()
        if self.result.exists():
            failure = self.read_result()
            return Ending(failure, found.state, found.error if failure is not None else None, self.requeues)
        detail = found.error or ("it left no result file" if found.state == "COMPLETED" else None)
        return Ending(NoResult(f"Slurm job {self.job_id} ended {found.state}"), found.state, detail, self.requeues)


def follow(handle: Any, run_dir: Optional[Path], since: float) -> Ending:
    """Wait for submitit job `handle` to end (its last attempt, whoever requeued it); `run_dir`: its run dir (its
    attempt log and, without accounting, its end records), None for a job that has none; `since`: when it was
    submitted (a time.time())."""
    return _Follower(handle, run_dir, since).follow()


def follow_job(handle: Any, run_dir: Path) -> int:
    """Wait for a submitted job to end (its last attempt, when Slurm requeued it) and report how it ended."""
    submitted = time.time()
    try:
        ending = follow(handle, run_dir, since=rundir.launched_at(run_dir))
    except KeyboardInterrupt:  # Ctrl-C while waiting: the job is Slurm's now, and goes on
        raise StoppedWaiting(str(handle.job_id), run_dir) from None
    if ending.error is None:
        code = 0
    else:  # submitit re-raises the remote failure; its traceback is in the Slurm log
        verdict = hang.read_request(run_dir, since=submitted)
        rank, error = job_states.rank_error(run_dir, submitted)
        refused = refusal_words(error)
        if verdict is not None and verdict.get("state") == hang.STOPPING:  # the watchdog's words, not submitit's
            print(verdict.get("message", ""))
            code = rundir.EXIT_HUNG
        elif refused:  # a rank's refusal (bad input, a full disk): its one message, and which kind in the last line
            print(f"hpc-train: {refused}")
            code = rundir.EXIT_REFUSED
        else:
            print(f"hpc-train: job {handle.job_id} failed: {_why(ending, rank, error)}")
            code = 1
    report_summary(run_dir, code)
    return code


def _why(ending: Ending, rank: Any, error: Any) -> str:
    """One line for a failed job: its failing rank's error, else the run dir's or Slurm's word, else submitit's first
    line that says something (its "failed during processing with trace:" says nothing)."""
    if error:
        return f"rank {rank}: {error}"
    if ending.detail:
        return f"{ending.state or 'ended'}: {ending.detail}"
    lines = [line.strip(" -") for line in str(ending.error).splitlines()]
    words = [line for line in lines if line and not line.endswith("with trace:")]
    return (ending.state + ": " if ending.state and ending.state != "COMPLETED" else "") + (
        words[0] if words else type(ending.error).__name__
    )
