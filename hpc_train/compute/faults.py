"""Fault injection for tests and drills, driven by environment variables (all unset in normal runs).

* ``HPC_TRAIN_FAIL_AT=RANK:STEP``: that rank raises just before taking optimizer step STEP+1
  (after STEP steps are done), to check that a failing rank ends the whole job quickly.
* ``HPC_TRAIN_SLOW_CHECKPOINT=SECONDS``: checkpoint writes pause half-way for that long,
  so a test can kill a run in the middle of a write.
* ``HPC_TRAIN_STEP_SLEEP=SECONDS``: sleep after every optimizer step of an attempt that started
  from scratch, so a test can act between two checkpoints of a tiny model; an attempt that
  resumed runs at full speed (the tests interrupt first attempts only, and wait for the rest).

Environment variables reach every rank, locally and through sbatch's ``--export=ALL``.
"""

from __future__ import annotations

import os
import time


class InjectedFailure(RuntimeError):
    """Raised by HPC_TRAIN_FAIL_AT: a stand-in for a rank hitting a bug or a bad node."""


def _float(name: str) -> float:
    try:
        return float(os.environ.get(name, "") or 0.0)
    except ValueError:
        return 0.0


def maybe_fail(rank: int, steps_done: int) -> None:
    spec = os.environ.get("HPC_TRAIN_FAIL_AT", "")
    if not spec:
        return
    fail_rank, _, fail_step = spec.partition(":")
    if int(fail_rank) == rank and int(fail_step) == steps_done:
        raise InjectedFailure(f"HPC_TRAIN_FAIL_AT={spec}: rank {rank} fails after {steps_done} steps (injected fault)")


def slow_checkpoint_write() -> None:
    delay = _float("HPC_TRAIN_SLOW_CHECKPOINT")
    if delay > 0:
        time.sleep(delay)


def step_sleep(resumed: bool = False) -> None:
    delay = 0.0 if resumed else _float("HPC_TRAIN_STEP_SLEEP")
    if delay > 0:
        time.sleep(delay)
