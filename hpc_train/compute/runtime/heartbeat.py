"""This rank's progress, published by a thread of its own, which also watches for hangs and repeated stop signals.

The training loop marks where it is (:func:`mark`, :func:`phase`: a few attribute writes, well
under a microsecond); a daemon thread publishes it every beat to ``logs/rank<r>.progress.json``
and, in between, waits on the signal wake-up pipe, so that it sees a stop signal even when the
main thread is stuck in native code (a collective, a read from a dead file system) and the
Python-level handler cannot run. The thread:

* answers the watcher's request (``logs/hang.json``) by dumping the stacks of every thread of
  this process, then of its data loader workers, into ``logs/rank<r>.log``, and exits with
  EXIT_HUNG when the watcher says so;
* on rank 0 (and on the last rank, should rank 0 stop publishing) is the watcher itself: when no
  rank has advanced for the hang timeout it asks for every rank's stacks, names the culprits
  (hpc_train.records.hang) and ends the job, requeueing it once on Slurm with ``trainer.requeue_on_hang``;
* after a first stop signal (SIGTERM, SIGINT, the requeue signal), which asks for a checkpoint
  after the current step, stops this rank at once, after dumping its stacks, on a second one
  (1 s or more later: Ctrl-C reaches the launcher and every rank at the same moment, and the
  launcher forwards it) or when the rank has not advanced for the stop grace period
  (``trainer.stop_grace_s``, at least 3 median steps). The exit code is EXIT_INTERRUPTED. A
  checkpoint being written is never cut short by the grace, and a second signal during it waits
  for its end (a third one does not).

Dumping uses ``faulthandler``, registered at start on SIGURG for this process (and, inherited
through fork, its data loader workers): SIGURG is ignored by default, so a process that did not
register it is not harmed by the signal.
"""

from __future__ import annotations

import contextlib
import faulthandler
import logging
import os
import select
import signal
import socket
import statistics
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Deque, Iterator, List, Optional, Union

from hpc_train.compute.runtime import attempts, pyspy, watchdog
from hpc_train.compute.runtime.ranks import RankInfo
from hpc_train.compute.runtime.runlog import log_to_file
from hpc_train.processes import procfs
from hpc_train.records import hang, rundir

log = logging.getLogger("hpc_train")

DUMP_SIGNAL = signal.SIGURG
REPEAT_WINDOW_S = 1.0  # a stop signal this soon after the first is the same request (terminal + launcher)
STALE_BEATS = 3  # a watcher whose record is this many beats old (plus 5 s) has lost its turn to the backup
STEP_WINDOW = 50  # steps in the running median


@dataclass(frozen=True)
class WatchdogSettings:
    """The trainer keys the heartbeat reads: when a rank counts as hung, what then, how long a stop may take."""

    hang_timeout_s: Union[float, str, None]  # seconds, auto or None (off): hang.timeout_s
    dist_timeout_s: float
    requeue_on_hang: bool
    stop_grace_s: float


def beat_seconds(timeout: Optional[float]) -> float:
    """Publish 20 times per timeout, between every 0.5 s and every 15 s (a 300-s timeout: every 15 s)."""
    return 15.0 if timeout is None else min(15.0, max(0.5, timeout / 20))


class Heartbeat:
    def __init__(
        self,
        run_dir: Path,
        ranks: RankInfo,
        settings: WatchdogSettings,
        stop_flag: Any = None,
        probe: Optional[Any] = None,
    ) -> None:
        self.run_dir, self.ranks, self.stop_flag = Path(run_dir), ranks, stop_flag
        self.probe = probe  # called every beat before publishing (a script job looks for new metrics rows)
        self.timeout_setting = settings.hang_timeout_s
        self.dist_timeout_s = float(settings.dist_timeout_s)
        self.requeue_on_hang = bool(settings.requeue_on_hang)
        self.stop_grace_s = float(settings.stop_grace_s)
        self.attempt = attempts.attempt_key()
        self.started = time.time()
        self.host = os.environ.get("SLURMD_NODENAME") or socket.gethostname()  # Slurm's name: what --exclude takes
        self.main_thread = threading.main_thread().ident or 0
        # Where the rank is: written by the training loop, read by the thread.
        self.step, self.phase_name, self.detail, self.since = 0, hang.SETUP, "", self.started
        self.nesting: List[str] = []  # the phases entered with phase() and not left yet (outermost first)
        self.warm = False  # finished a step in this attempt (setup and the first step get longer)
        self.step_times: Deque[float] = deque(maxlen=STEP_WINDOW)
        self.beat_s = beat_seconds(hang.timeout_s(self.timeout_setting, None, self.dist_timeout_s))
        # Files are named by the rank's number in the whole job. A replica group watches its own ranks only: a group
        # that hangs is named and ends alone (its launcher restarts it), the other groups train on.
        self.rank, self.first = ranks.global_rank, ranks.global_rank - ranks.rank
        self.scope = ranks.group if ranks.groups > 1 else None
        self.watching = ranks.rank == 0 or ranks.rank == ranks.world_size - 1
        self.script_pid: Optional[int] = None  # a script job's script: its stacks come from py-spy (see dump_stacks)
        self.answered: Optional[float] = None  # the request time whose stacks were dumped
        self.acted = False
        self.stop_first: Optional[float] = None  # time.time() of the first stop signal
        self.stops = 0  # stop signals received (a repeat within REPEAT_WINDOW_S counts once)
        self._log_file = None
        self._disk_full_said = False
        self._thread: Optional[threading.Thread] = None
        self._closing = threading.Event()
        self._wakeup: Optional[int] = None

    # -- the loop's side (cheap) ---------------------------------------------------------------
    def mark(self, phase: str, step: Optional[int] = None, detail: str = "") -> None:
        if step is not None:
            self.step = step
        self.phase_name, self.detail, self.since = phase, detail, time.time()

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        previous = self.phase_name, self.detail
        self.nesting.append(name)
        self.mark(name)
        try:
            yield
        finally:
            self.nesting.pop()
            self.mark(*previous[:1], detail=previous[1])

    @property
    def checkpointing(self) -> bool:
        """Inside a checkpoint (its own barriers included: a rank waits there while rank 0 writes)."""
        return self.phase_name == hang.CHECKPOINT or hang.CHECKPOINT in self.nesting

    def step_ended(self, seconds: float) -> None:
        self.step_times.append(seconds)
        self.warm = True

    @property
    def median_step_s(self) -> Optional[float]:
        return statistics.median(self.step_times) if self.step_times else None

    # -- start and stop ------------------------------------------------------------------------
    def start(self) -> "Heartbeat":
        global _current
        self._log_file = open(rundir.rank_log(self.run_dir, self.rank), "a")
        faulthandler.register(DUMP_SIGNAL, file=self._log_file, all_threads=True, chain=False)
        self._install_wakeup()
        self._publish()
        self._thread = threading.Thread(target=self._run, name="hpc-train-heartbeat", daemon=True)
        self._thread.start()
        _current = self
        return self

    def close(self) -> None:
        global _current
        _current = None
        self._closing.set()
        if self._wakeup is not None:
            with contextlib.suppress(OSError):
                os.write(self._pipe[1], b"\0")  # wake the thread from its wait on the pipe
        if self._thread is not None:
            self._thread.join(timeout=5)
        self.mark(hang.DONE)  # the watcher of a rank still at work takes over (see _my_turn)
        with contextlib.suppress(OSError):
            self._publish()
        faulthandler.unregister(DUMP_SIGNAL)
        if self._wakeup is not None and threading.current_thread() is threading.main_thread():
            signal.set_wakeup_fd(-1)  # installed only where none was set (see _install_wakeup)
            for fd in self._pipe:
                os.close(fd)
            self._wakeup = None
        if self._log_file is not None:
            self._log_file.close()

    def _install_wakeup(self) -> None:
        """The signal wake-up pipe: the C-level handler writes each signal's number there, whatever the main
        thread is doing (set only when the main thread installs it, and only if nobody else uses it)."""
        if self.stop_flag is None or threading.current_thread() is not threading.main_thread():
            return
        read, write = os.pipe()
        os.set_blocking(write, False)
        previous = signal.set_wakeup_fd(write, warn_on_full_buffer=False)
        if previous != -1:  # someone else's (an event loop): give it back, the Python handler still works
            signal.set_wakeup_fd(previous)
            os.close(read)
            os.close(write)
            return
        self._pipe, self._wakeup = (read, write), read
        self.stop_flag.announce = False  # this thread says it, at once

    # -- the thread ------------------------------------------------------------------------------
    def _run(self) -> None:
        while not self._closing.is_set():
            signals = self._wait(self.beat_s if self.stop_first is None else min(self.beat_s, 0.5))
            try:
                for signum in signals:
                    self._on_stop_signal(signum)
                self._check_grace()
                if self.probe is not None:
                    self.probe()
                self._publish()
                self._answer_request()
                if self.watching:
                    self._watch()
            except OSError as err:  # a full or unreachable disk must not end the rank from here
                if err.errno not in rundir.DISK_FULL_ERRNOS:
                    log.warning("heartbeat: %s", err)
                elif not self._disk_full_said:  # the main thread says it, at its next record: here the log only
                    self._disk_full_said = True
                    log_to_file(f"heartbeat: {err}", logging.WARNING)
            except Exception as err:  # never a traceback from this thread: say it once and carry on
                if not self._closing.is_set():
                    log.warning("heartbeat: %s: %s", type(err).__name__, err)

    def _wait(self, seconds: float) -> List[int]:
        if self._wakeup is None:
            self._closing.wait(seconds)
            return []
        try:
            ready, _, _ = select.select([self._wakeup], [], [], seconds)
            data = os.read(self._wakeup, 64) if ready else b""
        except (BlockingIOError, ValueError, OSError):  # nothing to read, or the pipe closed under us at the end
            return []
        return list(data)

    def _publish(self) -> None:
        hang.write_progress(
            self.run_dir,
            hang.RankProgress(
                rank=self.rank,
                host=self.host,
                pid=self.script_pid or os.getpid(),
                main_thread=self.main_thread,
                attempt=self.attempt,
                step=self.step,
                phase=self.phase_name,
                since=self.since,
                beat=time.time(),
                step_s=self.median_step_s,
                detail=self.detail,
                warm=self.warm,
            ),
        )

    # -- stacks ------------------------------------------------------------------------------------
    def dump_stacks(self, stamp: str) -> None:
        """Every thread of this process, then each data loader worker's, into the rank's log."""
        out = self._log_file
        if out is None:
            return
        rank = self.rank
        if self.script_pid is not None:  # the user's script: read from outside
            pid = self.script_pid
            head = hang.STACKS_BEGIN.format(rank=rank, pid=pid, host=self.host, main=pid, stamp=stamp)
            body = pyspy.dump(pid, rank)
            out.write("\n".join(["", head, *body, hang.STACKS_END.format(rank=rank, stamp=stamp), ""]))
            out.flush()
            return
        out.write(
            "\n"
            + hang.STACKS_BEGIN.format(rank=rank, pid=os.getpid(), host=self.host, main=self.main_thread, stamp=stamp)
            + "\n"
        )
        out.flush()
        faulthandler.dump_traceback(file=out, all_threads=True)
        for child in procfs.children(os.getpid()):
            out.write(hang.WORKER_HEADER.format(pid=child, rank=rank) + "\n")
            out.flush()
            try:
                os.kill(child, DUMP_SIGNAL)
            except ProcessLookupError:
                continue
            time.sleep(0.3)  # its handler writes to the same file: one at a time
        out.write(hang.STACKS_END.format(rank=rank, stamp=stamp) + "\n")
        out.flush()

    def _answer_request(self) -> None:
        request = hang.read_request(self.run_dir, since=self.started)
        if request is None or request.get("group") != self.scope:  # another replica group's hang is not ours
            return
        if request["state"] == hang.DUMPING and self.answered != request["time"]:
            self.answered = request["time"]
            self.dump_stacks(hang.stamp(request["time"]))
        elif request["state"] == hang.STOPPING and not self.acted:
            self._exit(rundir.EXIT_HUNG)

    # -- the watcher -------------------------------------------------------------------------------
    def _watch(self) -> None:
        if self.acted:
            return
        world = self.ranks.world_size
        records = hang.read_progress(self.run_dir, world, self.attempt, first=self.first)
        if len(records) < world:
            return  # not every rank runs yet: the process group's rendezvous timeout covers that
        if all(record.phase == hang.QUORUM for record in records.values()):
            return  # a replica group waiting for the others: the quorum's own timeouts govern it
        medians = [r.step_s for r in records.values() if r.step_s]
        limit = hang.timeout_s(self.timeout_setting, max(medians, default=None), self.dist_timeout_s)
        if limit is None:
            return
        allowed = limit * (1 if all(r.warm for r in records.values()) else hang.FIRST_STEP_FACTOR)
        now = time.time()
        if now - max(r.since for r in records.values()) < allowed or not self._my_turn(records, now):
            return
        self.acted = True
        watchdog.act_on_hang(
            self.run_dir, records, limit, self.requeue_on_hang, self.rank, self.dump_stacks, group=self.scope
        )
        self._exit(rundir.EXIT_HUNG)

    def _my_turn(self, records: dict, now: float) -> bool:
        """Rank 0 watches; the last rank takes over when rank 0 has stopped publishing (frozen or gone)."""
        if self.rank == self.first:
            return True
        first = records.get(self.first)
        return first is None or now - first.beat > STALE_BEATS * self.beat_s + 5

    # -- stop signals -------------------------------------------------------------------------------
    def _on_stop_signal(self, signum: int) -> None:
        if self.stop_flag is None or signum not in self.stop_flag.stop_signals:
            return
        name = signal.Signals(signum).name
        now = time.time()
        if self.stop_first is not None and now - self.stop_first < REPEAT_WINDOW_S:
            return  # the same request, delivered twice
        self.stops += 1
        if self.stop_first is None:
            self.stop_first = now
            self.stop_flag.request_stop(signum)
            os.write(
                2,
                f"hpc-train: received {name}: {self.stop_flag.then} (a second {name}, or no progress within"
                f" {self.grace_s():.0f} s, stops at once)\n".encode(),
            )
        elif self.checkpointing and self.stops == 2:  # the checkpoint that saves the work is being written
            os.write(
                2,
                f"hpc-train: received {name} again while writing a checkpoint: stopping right after it (a third"
                f" {name} stops at once)\n".encode(),
            )
        else:
            self._stop_now(f"received {name} again")

    def grace_s(self) -> float:
        return max(self.stop_grace_s, 3 * (self.median_step_s or 0.0))

    def _check_grace(self) -> None:
        if self.stop_first is None or self.checkpointing:  # a checkpoint being written is not a hang
            return
        last = max(self.stop_first, self.since)
        if time.time() - last > self.grace_s():
            self._stop_now(f"no progress for {self.grace_s():.0f} s after the stop request (trainer.stop_grace_s)")

    def _stop_now(self, why: str) -> None:
        stamp = hang.stamp(time.time())
        self.dump_stacks(stamp)
        message = (
            f"rank {self.rank}: {why}: stopping now, in {self.phase_name}"
            f"{f' at step {self.step}' if self.step else ''}, without a checkpoint of this step (its stacks are in"
            f" {rundir.rank_log(self.run_dir, self.rank)}); {rundir.resume_hint(self.run_dir)}"
        )
        os.write(2, f"hpc-train: {message}\n".encode())
        log_to_file(message)
        if self.ranks.is_main:
            attempts.end_current(self.run_dir, f"stopped at once ({why})", max(0, self.step - 1))
        self._exit(rundir.EXIT_INTERRUPTED)

    def _exit(self, code: int) -> None:
        """Leave at once, from this thread: the main thread is stuck; flush what was said first. The rank's own
        children (data loader workers, which may be stuck too) go with it."""
        for child in procfs.children(os.getpid()):
            with contextlib.suppress(OSError):
                os.kill(child, signal.SIGKILL)
        for handler in log.handlers:
            with contextlib.suppress(Exception):
                handler.flush()
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


# -- the module-level entry points the training code calls --------------------------------------------
_current: Optional[Heartbeat] = None


def mark(phase: str, step: Optional[int] = None, detail: str = "") -> None:
    """Record that this rank entered `phase` (of step `step`); a no-op without a running heartbeat."""
    if _current is not None:
        _current.mark(phase, step, detail)


@contextlib.contextmanager
def phase(name: str) -> Iterator[None]:
    """This rank is in `name` inside the block (e.g. a collective inside a checkpoint), then back where it was."""
    if _current is None:
        yield
        return
    with _current.phase(name):
        yield


def step_ended(seconds: float) -> None:
    if _current is not None:
        _current.step_ended(seconds)


def warmed_up() -> None:
    """Past the start (a script's first output): the first-step allowance is over."""
    if _current is not None:
        _current.warm = True


def is_warm() -> bool:
    """Past the start (see warmed_up); False without a running heartbeat."""
    return _current is not None and _current.warm
