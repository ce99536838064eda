"""Following a submitted Slurm job to the end of its last attempt, one follower for every waiting caller:
``launcher.wait`` (one job or a sweep's), the Python API's ``Job.wait()``, the Hydra app launcher; ``follow_job``
reports how the job ended and gives the exit code.

How a job's end is decided:

* hpc_train's own jobs (a run dir): Slurm's final state of the job (or, where accounting does not answer, what the
  run dir records: ``job_states.run_dir_state``) is the job's end; the run's records say why it failed. A job's
  tasks are not asked for result files: the steps of a job of replica groups are started by the batch host's agent
  (hpc_train.batchhost.groups), one per group, and leave no result file for most of the job's tasks; a requeued
  job's stopped attempt leaves a failed one while the job goes on. A change in the run's records or in the first
  task's result file (an attempt ending) only makes the follower ask Slurm every second for a while, so that the
  end is seen at once.
* a Hydra app's job (no run dir): its return value is submitit's result file, so that file is read (a success ends
  the wait at once), and a failure is the job's end only once Slurm (or, without accounting, the file alone) says
  the job ended; a later attempt's result replaces it.

submitit's own ``Job.results()`` is never the waiting loop: it takes the first result file for the job's end and
asks ``sacct`` on every poll, which, where accounting is off, printed its warning each time. States come from
``hpc_train.jobs.job_states`` (squeue, then the run dir's records), and that accounting does not answer is said once
per process.

One line says that a job was requeued (per new attempt: its attempt log, Slurm's state going back to the queue, or,
once it ended, accounting's record of each attempt: hpc_train.jobs.requeues, which ``hpc-train-report --watch`` uses
too); the caller reports how the last attempt ended. ``Follower.poll`` is one look, for a caller with a loop of its
own (``Job.wait()``: its timeout, a laptop's reconnection).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional, Tuple

from hpc_train.errors import JobFailed
from hpc_train.jobs import job_states
from hpc_train.jobs.requeues import Requeues
from hpc_train.launch.backends.run import report_summary
from hpc_train.launch.planning.errors import StoppedWaiting
from hpc_train.records import hang, rundir
from hpc_train.records.rank_errors import refusal_words

RESULT_POLL_S = 1.0  # how often the result file is looked at (a file test)
STATE_POLL_S = 5.0  # how often Slurm is asked while no result says the attempt failed (a job that ended without one)
HURRY_S = 60.0  # after an end mark changed: how long Slurm is asked every RESULT_POLL_S (the end comes in seconds)
UNKNOWN_GRACE_S = 30.0  # nobody lists the job (no accounting, no run dir to read): how long before it counts as ended
GONE = "neither squeue nor sacct knows it any more"  # how a job Slurm forgot ended


class _Said:
    accounting_silent = False  # said once per process: a sweep follows many jobs


def say_accounting_silent() -> None:
    if not _Said.accounting_silent:
        _Said.accounting_silent = True
        print(f"hpc-train: {job_states.FROM_RUN_DIRS}", flush=True)


class NoResult(JobFailed):
    """A job that ended without a result file (cancelled, killed, out of time or memory, a node lost)."""


@dataclass
class Ending:
    """How a followed job ended: its result (None: it completed), or why not."""

    error: Optional[BaseException]  # the last attempt's failure as submitit raises it; None when it completed
    state: Optional[str]  # Slurm's (or the run dir's) final word; None when nobody knows the job any more
    detail: Optional[str] = None  # the run dir's one-line reason, when there was no result file
    requeues: int = 0


class Follower:
    """One Slurm job followed to the end of its last attempt: `poll` looks once, `follow` until it ended.

    `run_dir`: the job's run dir (None: a Hydra app's job, whose result file is its outcome); `since`: when it was
    launched (a time.time(): its attempt log's records from then on are this launch's); `handle`: its submitit job
    (for a run dir, only for a failure's words; None for a job known by its id alone); `look`: how Slurm is asked
    (default: hpc_train.jobs.job_states; the Python API passes its job's watch, which a sweep's jobs share and a
    laptop runs over SSH)."""

    def __init__(
        self,
        job_id: str,
        run_dir: Optional[Path],
        since: float,
        handle: Any = None,
        look: Optional[Callable[[], Optional[job_states.SlurmState]]] = None,
    ) -> None:
        self.job_id, self.run_dir, self.since, self.handle = str(job_id), run_dir, since, handle
        self.result = Path(handle.paths.result_pickle) if handle is not None else None
        self.look = look or self.slurm_state
        self.requeue = Requeues(self.job_id, run_dir, since)  # its attempts after the first, each said once
        self.unknown_since: Optional[float] = None
        self.next_state_at = time.monotonic()  # the first look asks Slurm (a job waited for long after it ended)
        self.failure: Optional[BaseException] = None  # a Hydra app's job: its last result file's failure
        self.read_at: Optional[float] = None  # the result file's mtime when it was last read
        self.marks = self.end_marks() if run_dir is not None else None  # a run dir's end marks when last looked at
        self.hurry_until = 0.0  # until then Slurm is asked every RESULT_POLL_S (an attempt has just ended)

    @property
    def requeues(self) -> int:
        return self.requeue.count

    @property
    def last_state(self) -> Optional[str]:
        return self.requeue.last_state

    # -- asking Slurm ---------------------------------------------------------------------------------
    def slurm_state(self) -> Optional[job_states.SlurmState]:
        return job_states.slurm_job_states(
            [self.job_id], {self.job_id: self.run_dir} if self.run_dir is not None else None
        ).get(self.job_id)

    def state(self) -> Optional[job_states.SlurmState]:
        found = self.look()
        if found is not None and found.from_run_dir:
            say_accounting_silent()
        self.requeue.note(found.state if found is not None else None)
        return found

    def due(self) -> bool:
        """Time to ask Slurm again (every STATE_POLL_S while nothing says the job may have ended)."""
        if time.monotonic() < self.next_state_at:
            return False
        self.next_state_at = time.monotonic() + STATE_POLL_S
        return True

    def in_queue(self) -> bool:
        """Back in the queue after a requeue (where a job may wait for hours): asked only every STATE_POLL_S."""
        return self.requeue.in_queue()

    # -- one look -----------------------------------------------------------------------------------------
    def poll(self) -> Optional[Ending]:
        """One look: how the job ended, or None while it goes on (file tests every call; Slurm only when due)."""
        return self.poll_run() if self.run_dir is not None else self.poll_result()

    def follow(self) -> Ending:
        while True:
            ending = self.poll()
            if ending is not None:
                return ending
            time.sleep(RESULT_POLL_S)

    def poll_run(self) -> Optional[Ending]:
        """hpc_train's job: Slurm's word on the job decides; a change in its end marks hurries the next looks."""
        marks = self.end_marks()
        if marks != self.marks:
            self.marks, self.hurry_until = marks, time.monotonic() + HURRY_S
        hurry = time.monotonic() < self.hurry_until and not self.in_queue()
        if not (hurry or self.due()):
            return None
        ending, unknown_for = self.slurm_word()
        if ending is not None or unknown_for is None or unknown_for <= UNKNOWN_GRACE_S:
            return ending
        if self.summarised():  # its run says it finished: the records are the word left
            return Ending(None, "COMPLETED", requeues=self.requeues)
        return self.gone()

    def slurm_word(self) -> Tuple[Optional[Ending], Optional[float]]:
        """Slurm's word on the job: its Ending once it has ended; else None, with how long neither squeue nor sacct
        has known it (None while Slurm knows it)."""
        found = self.state()
        if found is not None and found.state in job_states.ENDED:
            return self.ended(found), None
        if found is not None:
            self.unknown_since = None
            return None, None
        self.unknown_since = self.unknown_since or time.monotonic()
        return None, time.monotonic() - self.unknown_since

    def gone(self) -> Ending:
        """The end of a job Slurm no longer knows: the attempt's failure when one was read, else that it is gone."""
        return Ending(self.failure or NoResult(f"Slurm job {self.job_id}: {GONE}"), None, GONE, self.requeues)

    def end_marks(self) -> Tuple[Optional[float], ...]:
        """When the files that change as an attempt ends were last written: the run's summary and attempt log, the
        first task's result file."""
        assert self.run_dir is not None
        paths = [self.run_dir / rundir.SUMMARY, self.run_dir / rundir.ATTEMPTS, self.result]
        return tuple(_mtime(path) for path in paths)

    def summarised(self) -> bool:
        assert self.run_dir is not None
        return (_mtime(self.run_dir / rundir.SUMMARY) or 0.0) >= self.since

    def poll_result(self) -> Optional[Ending]:
        """A Hydra app's job: its result file is its outcome (read once per new or rewritten file)."""
        assert self.result is not None
        fresh = False
        if self.result.exists() and self.result.stat().st_mtime != self.read_at:
            self.read_at, fresh = self.result.stat().st_mtime, True
            self.failure = self.read_result()
            if self.failure is None:
                self.requeue.note(None)
                self.requeue.note_accounted()
                return Ending(None, "COMPLETED", requeues=self.requeues)
        # a failed attempt: has the job ended? Asked every RESULT_POLL_S, but only every STATE_POLL_S once it is
        # back in the queue (a requeued job may wait there for hours)
        if not (fresh or (self.failure is not None and not self.in_queue()) or self.due()):
            return None
        ending, unknown_for = self.slurm_word()
        if ending is not None or unknown_for is None:
            return ending
        if self.failure is not None or unknown_for > UNKNOWN_GRACE_S:
            return self.gone()
        return None

    def read_result(self) -> Optional[BaseException]:
        """The result files' outcome: None for success, else submitit's exception (they exist: no sacct call). For
        hpc_train's job only the first task's is read: a job's other tasks may write none (a replica group's step)."""
        try:
            if self.run_dir is not None:
                return self.handle.task(0).exception()
            self.handle.results()
            return None
        except Exception as err:
            return err

    def ended(self, found: job_states.SlurmState) -> Ending:
        """The job ended. hpc_train's job: Slurm's (or the run dir's) state is how; a failure's words are the run
        dir's, else the first task's failed result file of this launch. A Hydra app's job: the last attempt's result
        file says how (read again: it may be newer than the one that was there a moment ago); without one, Slurm's
        state and the run dir's reason."""
        self.requeue.note_accounted()
        if self.run_dir is not None:
            if found.state == "COMPLETED":
                return Ending(None, "COMPLETED", requeues=self.requeues)
            failed = self.read_result() if (_mtime(self.result) or 0.0) >= self.since else None
            error = failed or NoResult(f"Slurm job {self.job_id} ended {found.state}")
            return Ending(error, found.state, found.error, self.requeues)
        if self.result is not None and self.result.exists():
            failure = self.read_result()
            return Ending(failure, found.state, found.error if failure is not None else None, self.requeues)
        detail = found.error or ("it left no result file" if found.state == "COMPLETED" else None)
        return Ending(NoResult(f"Slurm job {self.job_id} ended {found.state}"), found.state, detail, self.requeues)


def _mtime(path: Optional[Path]) -> Optional[float]:
    try:
        return path.stat().st_mtime if path is not None else None
    except OSError:
        return None


def follow(handle: Any, run_dir: Optional[Path], since: float) -> Ending:
    """Wait for submitit job `handle` to end (its last attempt, whoever requeued it); `run_dir`: its run dir (its
    attempt log and, without accounting, its end records), None for a job that has none; `since`: when it was
    submitted (a time.time())."""
    return Follower(str(handle.job_id), run_dir, since, handle).follow()


def follow_job(handle: Any, run_dir: Path) -> int:
    """Wait for a submitted job to end (its last attempt, when Slurm requeued it) and report how it ended."""
    submitted = rundir.launched_at(run_dir)  # a sweep's later jobs may have ended while an earlier one was followed
    try:
        ending = follow(handle, run_dir, since=submitted)
    except KeyboardInterrupt:  # Ctrl-C while waiting: the job is Slurm's now, and goes on
        raise StoppedWaiting(str(handle.job_id), run_dir) from None
    if ending.error is None:
        code = 0
    else:  # submitit re-raises the remote failure; its traceback is in the Slurm log
        verdict = hang.read_request(run_dir, since=submitted)
        rank, error = job_states.first_rank_error(run_dir, submitted)
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
