"""Stop requests: turn Slurm's signals into a checkpoint at the next step boundary.

A signal handler only sets a flag; the training loop polls it between optimizer steps, and
in a multi-rank job all ranks agree (one tiny all-reduce per step) so that every rank stops
after the same step and the checkpoint is consistent. Two signals are handled:

* the requeue signal (``launcher.signal``, USR2 by default), which Slurm sends
  ``launcher.signal_delay_s`` seconds before the time limit (``#SBATCH --signal``) and which
  ``scancel --signal=USR2`` sends on demand: checkpoint, then requeue the job;
* SIGTERM, which Slurm sends on preemption, ``scancel`` and at the time limit itself, and
  SIGINT (Ctrl-C): checkpoint, then exit (Slurm requeues preempted jobs itself where the
  partition says so).

A second stop signal, or a step that does not end within the stop grace period, stops the rank
at once after dumping its stacks: the rank's heartbeat thread does that (hpc_train.compute.runtime.heartbeat),
since a handler that only sets a flag cannot stop a step that never ends.
"""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass
from typing import Any, Callable, Dict, Optional

from hpc_train.config.launcher import signal_name
from hpc_train.slurm import slurm_cli
from hpc_train.slurm.slurm_time import slurm_seconds

NONE, REQUEUE, TERMINATE = 0, 1, 2  # ordered: when ranks disagree, the strongest request wins


@dataclass(frozen=True)
class LauncherSettings:
    """The ``launcher`` section as a rank reads it: the requeue signal and how long before the time limit it comes
    (the other keys are the login side's: tests/unit/test_rank_settings.py lists them)."""

    signal: str
    signal_delay_s: int


class StopFlag:
    """The flag the handler (``on_signal``) sets, and the handlers found before (submitit's), kept for the reason.

    The entry point installs the handler for the rank's run: ``with handling(flag.stop_signals, flag.on_signal)``
    (hpc_train.processes.signal_relay), which puts the previous ones back whatever ends the run."""

    def __init__(self, requeue_signal: int, then: str = "checkpointing after the current step") -> None:
        self.requeue_signal = requeue_signal
        self.then = then  # what happens next, for the line the handler prints
        self.request = NONE
        self.stop_signals = (self.requeue_signal, signal.SIGTERM, signal.SIGINT)
        self.previous: Dict[int, Any] = {signum: signal.getsignal(signum) for signum in self.stop_signals}
        self.announce = True  # False once a heartbeat thread says it (at once, even while the main thread is stuck)

    def request_stop(self, signum: int) -> None:
        self.request = max(self.request, REQUEUE if signum == self.requeue_signal else TERMINATE)

    def on_signal(self, signum: int, frame: Any) -> None:
        self.request_stop(signum)
        if self.announce:  # logging from a signal handler can deadlock on the handler's lock: write directly
            os.write(2, f"hpc-train: received {signal.Signals(signum).name}: {self.then}\n".encode())

    def submitit_handler(self) -> Optional[Callable]:
        """submitit's checkpoint-and-requeue handler, when this process runs under submitit."""
        handler = self.previous.get(self.requeue_signal)
        owner = getattr(handler, "__self__", None)
        if owner is not None and hasattr(owner, "has_timed_out"):
            return handler
        return None

    def agreed(self) -> int:
        """The strongest request of any rank (a collective in multi-rank jobs: every rank calls it)."""
        from hpc_train.compute.runtime import distributed  # torch: the login node imports this module via job.py

        return distributed.all_reduce_max_int(self.request)

    def reason(self, request: int, signal_delay_s: float) -> str:
        """finish/timeout/preemption/terminated wording for the attempt log."""
        if request == TERMINATE:
            return "terminated (SIGTERM: preemption, scancel or the time limit; or SIGINT)"
        handler = self.submitit_handler()
        if handler is not None:
            return "timeout" if handler.__self__.has_timed_out() else "preemption"
        left = slurm_time_left_s()
        if left is None:
            return f"stop signal ({signal.Signals(self.requeue_signal).name})"
        return "timeout" if left <= 2 * signal_delay_s + 60 else "preemption"


def signal_number(name: str) -> int:
    """The signal a config names (USR2, usr2, SIGUSR2: spelled as config.launcher.signal_name spells it)."""
    return int(getattr(signal, "SIG" + signal_name(name)))


def slurm_time_left_s() -> Optional[float]:
    """Seconds left before this Slurm job's time limit, from squeue (None outside Slurm)."""
    job = os.environ.get("SLURM_JOB_ID")
    if not job:
        return None
    try:
        return slurm_seconds((slurm_cli.query(["squeue", "-h", "-j", job, "-o", "%L"], timeout=15) or "").strip())
    except ValueError:
        return None


class TrainingInterrupted(Exception):
    """Training stopped at a step boundary after a checkpoint, because a stop signal arrived."""

    def __init__(self, request: int, step: int, reason: str, flag: StopFlag, message: str = "") -> None:
        super().__init__(message or f"stopped after step {step} ({reason}); a checkpoint holds the state")
        self.request = request
        self.step = step
        self.reason = reason
        self.flag = flag
