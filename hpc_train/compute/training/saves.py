"""The training loop's checkpoint saves: when they are due, at most one in flight, and what each one cost.

The trainer asks for a save at a step boundary (:meth:`Saves.after_step` when one is due,
:meth:`Saves.save` at a stop or at the end); a save written in the background is recorded at a
later boundary, once it is written everywhere. Each written save adds a ``checkpoint`` row to
metrics.jsonl (how long training waited for it, how long it took, its size) and the time training
waited to the run's total (the summary's ``checkpoint_blocked_s``). The first save written after a
measured step also tells whether Slurm's stop signal comes early enough to finish a step and a
checkpoint before the time limit.
"""

from __future__ import annotations

import logging
import time
from typing import Callable, Optional

from hpc_train.compute.checkpointing.background import Ticket
from hpc_train.compute.checkpointing.checkpointer import Checkpointer
from hpc_train.compute.checkpointing.files import size_on_disk
from hpc_train.compute.runtime import heartbeat
from hpc_train.compute.runtime.runlog import MetricsWriter
from hpc_train.records import hang

log = logging.getLogger("hpc_train")


class Saves:
    """The checkpoint saves of one attempt. `slurm_job`: the ranks run inside a Slurm job, whose stop signal comes
    `signal_delay_s` seconds before the time limit (the lead the first save is checked against)."""

    def __init__(
        self, checkpointer: Checkpointer, metrics: MetricsWriter, is_main: bool, slurm_job: bool, signal_delay_s: float
    ) -> None:
        self.checkpointer, self.metrics, self.is_main = checkpointer, metrics, is_main
        self.slurm_job, self.signal_delay_s = slurm_job, signal_delay_s
        self.blocked_s = 0.0  # the time training waited for checkpoints, this attempt (the summary states it)
        self.step_ended: Optional[float] = None  # perf_counter at the end of the previous step (for its duration)
        self.last_step_s: Optional[float] = None  # the duration of the last step (the lead-time check reads it)
        self.lead_checked = False

    def after_step(self, step: int, before_save: Callable[[], None]) -> None:
        """At the end of optimizer step `step`: time it, record a background save once written (its error raised),
        and checkpoint when due, calling `before_save` first."""
        now = time.perf_counter()
        self.last_step_s, self.step_ended = (now - self.step_ended if self.step_ended else None), now
        self.collect(wait=False)
        if self.checkpointer.due(step):
            before_save()
            self.save(step, "every %d steps" % self.checkpointer.every)
            self.step_ended = time.perf_counter()  # the next step's duration leaves the save out

    def save(self, step: int, why: str, settle: bool = False) -> None:
        """Checkpoint this step. The loop waits for the previous save if it is still being written, then while this
        one is staged (``trainer.async_checkpoint``) or written; `settle`: until it is written in any case (a stop,
        the end of training: nothing exits before its checkpoint is durable)."""
        with heartbeat.phase(hang.CHECKPOINT):
            self.collect(wait=True)  # at most one save in flight: the previous one first
            started = time.perf_counter()
            ticket = self.checkpointer.save(step, why)
            if ticket is not None:
                ticket.blocked_s = time.perf_counter() - started
                if not ticket.background:  # written: the whole save blocked training (its total, _record)
                    self._record(ticket)
            if settle:
                self.collect(wait=True)

    def collect(self, wait: bool) -> None:
        """Record the save in flight once it is written everywhere (`wait`: wait for it; that wait counts as time the
        save blocked training). A save that failed in the background raises its error here, on every rank."""
        started = time.perf_counter()
        ticket = self.checkpointer.finished(wait)
        if ticket is None:
            return
        if wait:
            ticket.blocked_s += time.perf_counter() - started
        self._record(ticket)

    def _record(self, ticket: Ticket) -> None:
        """A written checkpoint's metrics.jsonl row: how long training waited for it, how long it took, its size."""
        self.blocked_s += ticket.blocked_s
        # A save written in the loop, or one waited for: done when the wait ended.
        ticket.total_s = max(ticket.total_s or 0.0, ticket.blocked_s)
        if self.is_main:
            self.metrics.write(
                {
                    "kind": "checkpoint",
                    "step": ticket.step,
                    "blocked_s": round(ticket.blocked_s, 6),
                    "total_s": round(ticket.total_s, 6),
                    "bytes": size_on_disk(ticket.path),
                    "async": ticket.background,
                    "time": time.time(),
                }
            )
        self.check_signal_lead(ticket)

    def check_signal_lead(self, ticket: Ticket) -> None:
        """At the first checkpoint written after a measured step: warn when Slurm's stop signal comes too late to
        finish a step and write a checkpoint before the time limit (no checkpoint is written in a signal handler:
        the stop waits for the end of the current step). With saves in the background the stop may also have to
        wait for the one in flight: twice a save's duration."""
        step_s = self.last_step_s
        if self.lead_checked or step_s is None or not self.slurm_job:
            return
        self.lead_checked = True
        lead = float(self.signal_delay_s)
        checkpoint_s = (ticket.total_s or 0.0) * (2 if ticket.background else 1)
        needed = step_s + checkpoint_s
        if self.is_main and lead < needed:
            log.warning(
                "launcher.signal_delay_s=%d is shorter than one step plus a checkpoint (measured %.0f s: step %.1f s +"
                " checkpoint %.1f s%s): at the time limit the job may be killed before its stop checkpoint. Fix:"
                " raise launcher.signal_delay_s (e.g. to %d).",
                lead,
                needed,
                step_s,
                checkpoint_s,
                ", the one in flight and the stop's own" if ticket.background else "",
                int(2 * needed) + 30,
            )
