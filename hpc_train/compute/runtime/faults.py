"""Fault injection for tests and drills, driven by environment variables (all unset in normal runs).

* ``HPC_TRAIN_FAIL_AT=RANK:STEP``: that rank raises just before taking optimizer step STEP+1
  (after STEP steps are done), to check that a failing rank ends the whole job quickly.
* ``HPC_TRAIN_KILL_AT=RANK:STEP``: that rank (its number in the whole job) sends itself SIGKILL at the same point,
  as a node failure or the OOM killer would end it; a replica group restarted after it does not do it again.
  ``RANK:start``: with replica groups, as its group starts, before it is ready (a failure during start-up).
  ``RANK:STEP.average``: with replica groups, inside step STEP+1 as the all-reduce across the groups begins (the
  other groups are inside a collective of torchft's when it dies).
* ``HPC_TRAIN_RESTART_SLEEP=SECONDS``: a restarted replica group waits that long before it rejoins (a slow node's
  start-up), so that a test sees the other groups train on without it first.
* ``HPC_TRAIN_SLOW_CHECKPOINT=SECONDS``: checkpoint writes pause half-way for that long,
  so a test can kill a run in the middle of a write.
* ``HPC_TRAIN_STEP_SLEEP=SECONDS``: sleep after every optimizer step of an attempt that started
  from scratch, so a test can act between two checkpoints of a tiny model; an attempt that
  resumed runs at full speed (the tests interrupt first attempts only, and wait for the rest).
* ``HPC_TRAIN_DISK_FULL_AT=POINT:STEP``: the checkpoint of step STEP fails with ENOSPC at POINT, where a test
  cannot make a real full disk fail (a tmpfs fills on a write, never on an fsync or a rename): ``write`` (a write
  of the stream, inside torch.save), ``header`` (the header written over its place once the body is hashed),
  ``fsync``, ``rename`` (single-file checkpoints), ``manifest`` and ``install`` (a sharded checkpoint's manifest
  and the rename that installs its dir). See :data:`DISK_FULL_POINTS`.
* ``HPC_TRAIN_OOM_AT=RANK:STEP``: that rank's forward pass of step STEP+1 raises CUDA's out-of-memory error, on a
  CPU too, so a test sees what the message of a real one says.
* ``HPC_TRAIN_STEP_SLEEP_FROM=STEP``: with HPC_TRAIN_STEP_SLEEP, the steps before STEP run at full speed: a test
  that needs the time only after a fault sleeps only then (one that waits for a restarted replica group holds
  instead: HPC_TRAIN_HOLD_AT).
* ``HPC_TRAIN_HOLD_AT=STEP``: with replica groups, from optimizer step STEP on, a group takes a step only once its
  launcher has restarted a group and every group missing from the last step has each of its ranks asking for the
  quorum again (a restarted group's ranks say so before their first quorum): the live groups are still training
  when a restarted group comes back, however long its start-up takes, where a per-step sleep would only make that
  likely. A test of a fault before STEP names the step after it; a test that brings the fault about itself (a node
  set down) names the step it acts at, and every group holds there until the restart. Read by
  hpc_train.compute.training.replica_steps.
* ``HPC_TRAIN_STEP_SLEEP_RANK=RANK``: with HPC_TRAIN_STEP_SLEEP, only that rank sleeps (the rank
  from ``RANK`` or ``SLURM_PROCID``), so the other ranks wait for it inside the next collective:
  a test can deliver a stop signal while rank 0 is blocked in one.

Environment variables reach every rank, locally and through sbatch's ``--export=ALL``.
"""

from __future__ import annotations

import errno
import os
import signal
import time
from typing import Callable, Union

from hpc_train.processes.rank_env import REPLICA_RESTART_VARIABLE

DISK_FULL_POINTS = ("write", "header", "fsync", "rename", "manifest", "install")
HOLD_VARIABLE = "HPC_TRAIN_HOLD_AT"  # replica groups: from that step on, the groups wait for a restarted one
HOLD_POLL_S = 0.05  # how often a held group looks again (HPC_TRAIN_HOLD_AT)
HOLD_LIMIT_S = 300.0  # a hold for a group that never comes back ends here: the test fails on what it checks


class InjectedFailure(RuntimeError):
    """Raised by HPC_TRAIN_FAIL_AT: a stand-in for a rank hitting a bug or a bad node."""


def _float(name: str) -> float:
    try:
        return float(os.environ.get(name, "") or 0.0)
    except ValueError:
        return 0.0


def _at(variable: str, rank: int, steps_done: Union[int, str]) -> str:
    """The value of `variable` (RANK:STEP) when it names this rank after `steps_done` steps (or at the point named
    so, such as ``start``), else ""."""
    spec = os.environ.get(variable, "")
    if not spec:
        return ""
    at_rank, _, at_step = spec.partition(":")
    return spec if int(at_rank) == rank and at_step.strip() == str(steps_done) else ""


def maybe_fail(rank: int, steps_done: int) -> None:
    spec = _at("HPC_TRAIN_FAIL_AT", rank, steps_done)
    if spec:
        raise InjectedFailure(f"HPC_TRAIN_FAIL_AT={spec}: rank {rank} fails after {steps_done} steps (injected fault)")


def maybe_kill(rank: int, steps_done: Union[int, str]) -> None:
    if _at("HPC_TRAIN_KILL_AT", rank, steps_done) and int(os.environ.get(REPLICA_RESTART_VARIABLE) or 0) == 0:
        if os.getpid() == 1:  # the first process of a container's pid namespace ignores its own SIGKILL
            os._exit(128 + signal.SIGKILL)  # what a shell reports for a process killed by it
        os.kill(os.getpid(), signal.SIGKILL)


def restart_sleep() -> None:
    delay = _float("HPC_TRAIN_RESTART_SLEEP")
    if delay > 0:
        time.sleep(delay)


def maybe_out_of_memory(rank: int, steps_done: int) -> None:
    spec = _at("HPC_TRAIN_OOM_AT", rank, steps_done)
    if spec:
        # torch: only when injecting (this module stays importable without it)
        import torch

        raise torch.cuda.OutOfMemoryError(
            f"CUDA out of memory. Tried to allocate 2.00 GiB (injected: HPC_TRAIN_OOM_AT={spec})"
        )


def disk_full_at(point: str, step: int) -> None:
    """Raise ENOSPC here when HPC_TRAIN_DISK_FULL_AT names this point of the checkpoint of `step`."""
    spec = os.environ.get("HPC_TRAIN_DISK_FULL_AT", "")
    if not spec:
        return
    where, _, at = spec.partition(":")
    assert where in DISK_FULL_POINTS, f"HPC_TRAIN_DISK_FULL_AT={spec}: the point is one of {DISK_FULL_POINTS}"
    if where == point and int(at) == step:
        raise OSError(errno.ENOSPC, f"{os.strerror(errno.ENOSPC)} (injected: HPC_TRAIN_DISK_FULL_AT={spec})")


def slow_checkpoint_write() -> None:
    delay = _float("HPC_TRAIN_SLOW_CHECKPOINT")
    if delay > 0:
        time.sleep(delay)


def _own_rank() -> str:
    return os.environ.get("RANK") or os.environ.get("SLURM_PROCID") or "0"


def step_sleep(step: int, resumed: bool = False) -> None:
    """HPC_TRAIN_STEP_SLEEP after optimizer step `step` (1 for the first) of an attempt from scratch."""
    delay = 0.0 if resumed or step < _float("HPC_TRAIN_STEP_SLEEP_FROM") else _float("HPC_TRAIN_STEP_SLEEP")
    only = os.environ.get("HPC_TRAIN_STEP_SLEEP_RANK", "").strip()
    if only and only != _own_rank():
        return
    if delay > 0:
        time.sleep(delay)


def hold_from() -> int:
    """The step HPC_TRAIN_HOLD_AT names (0: unset)."""
    return int(_float(HOLD_VARIABLE))


def hold(step: int, back: Callable[[], bool]) -> float:
    """Before optimizer step `step`, from the step HPC_TRAIN_HOLD_AT names on: wait until `back()` (at most
    HOLD_LIMIT_S); the seconds waited."""
    at = hold_from()
    if not at or step < at:
        return 0.0
    started = time.monotonic()
    while not back() and time.monotonic() - started < HOLD_LIMIT_S:
        time.sleep(HOLD_POLL_S)
    return time.monotonic() - started
