"""Which rank failed first: each failing rank leaves a small record, the launcher reads them.

When one rank raises, its peers fail moments later with connection errors ("Connection closed
by peer") that say nothing about the cause. Every failing rank writes
``logs/rank<r>.error.json`` (time, exception) before tearing anything down, so the local
launcher can name the rank that failed *first* and its exception, whichever process happens to
exit first (see :func:`root_cause`). Shared by both sides: no torch here.
"""

from __future__ import annotations

import functools
import signal
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple, TypeVar

from hpc_train.records import rundir

F = TypeVar("F", bound=Callable[..., Any])

DIED_AT = "_hpc_train_died_at"  # the attribute an exception carries from where it was first seen


def note_time_of_death(error: BaseException) -> None:
    """Stamp `error` with the time it left the training step, once: its record is timed by it, not by the moment
    the record is written after unwinding (closing data loader workers, loggers) that may take seconds."""
    if getattr(error, DIED_AT, None) is None:
        try:
            setattr(error, DIED_AT, time.time())
        except AttributeError:  # an exception type without a __dict__
            pass


def notes_time_of_death(function: F) -> F:
    """Decorator: exceptions leaving `function` carry their time of death (see :func:`note_time_of_death`)."""

    @functools.wraps(function)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return function(*args, **kwargs)
        except BaseException as error:
            note_time_of_death(error)
            raise

    return wrapper  # type: ignore[return-value]


def write_error_record(run_dir: Path, rank: int, error: BaseException, when: Optional[float] = None) -> None:
    """Record this rank's failure, timed at its death (best effort: a failing rank must not fail again here)."""
    text = f"{type(error).__name__}: {error}".strip()
    when = getattr(error, DIED_AT, None) if when is None else when
    write_record(run_dir, rank, text.splitlines()[0] if text else type(error).__name__, when)


REFUSAL_PREFIX = "Refusal: "  # a record of a rank's refusal (compute.runtime.refusal.Refusal): one message, no bug


def refusal_words(error: Optional[str]) -> Optional[str]:
    """The refusal's message when the record is a rank's refusal, else None."""
    return error[len(REFUSAL_PREFIX) :] if error and error.startswith(REFUSAL_PREFIX) else None


def write_record(run_dir: Path, rank: int, text: str, when: Optional[float] = None) -> None:
    """A failure record in words; `when` is the time of death (default: now)."""
    record = {"rank": rank, "time": time.time() if when is None else when, "error": text[:500]}
    try:
        rundir.write_json_atomic(rundir.rank_error(run_dir, rank), record)
    except OSError:
        pass


def read_records(run_dir: Path, world_size: int, since: float) -> Dict[int, Dict[str, Any]]:
    """The failure records written after `since` (a time.time()), by rank."""
    records = {}
    for rank in range(world_size):
        record = rundir.read_json(rundir.rank_error(run_dir, rank))
        if isinstance(record, dict) and float(record.get("time", 0)) >= since:
            records[rank] = record
    return records


def root_cause(
    failed: List[Tuple[int, int]], records: Dict[int, Dict[str, Any]]
) -> Tuple[int, Optional[Dict[str, Any]]]:
    """Which rank to blame, given the (rank, exit code) pairs seen failed so far and the records.

    A rank that died without a record (SIGKILL, the OOM killer, a segfault) comes first: peers
    that fail *because* of it raise an exception and leave a record. Otherwise the earliest
    record names the rank whose exception started it all: records are timed at the death (the
    exception leaving the training step, a hung rank's last advance), not when they were written.
    """
    silent = [rank for rank, _ in failed if rank not in records]
    if silent:
        return silent[0], None
    rank = min(records, key=lambda r: float(records[r]["time"]))
    return rank, records[rank]


def death_cause(code: int, known: str = "") -> str:
    """How a process with this exit status ended, in words, with where to look for a signal's cause; `known`: what
    hpc_train found out about it (an OOM kill its cgroup counted, a node Slurm set DOWN), said instead of the guess."""
    if code > 128 and code - 128 in SIGNAL_NUMBERS:  # a container runtime (or a shell) reports a signal so
        name, hint = _signal_words(code - 128)
        said = f"exited with code {code} (128 + {code - 128}: how a container runtime or a shell reports {name})"
        return said + (f": {known}" if known else hint)
    if code >= 0:
        return f"exited with code {code}" + (f": {known}" if known else "")
    name, hint = _signal_words(-code)
    return f"was killed by {name} (signal {-code})" + (f": {known}" if known else hint)


def short_cause(code: int) -> str:
    """The exit status in a word or two, for a record ("SIGKILL", "exit code 1")."""
    number = code - 128 if code > 128 and code - 128 in SIGNAL_NUMBERS else -code if code < 0 else 0
    if number:
        try:
            return signal.Signals(number).name
        except ValueError:
            return f"signal {number}"
    return f"exit code {code}"


def is_sigkill(code: int) -> bool:
    """SIGKILL, as a parent sees it (-9) or as a container runtime or a shell reports it (137)."""
    return code in (-signal.SIGKILL, 128 + signal.SIGKILL)


OOM_KILL_KNOWN = "the kernel's out-of-memory killer took it (its cgroup's memory.events counted an OOM kill)"
NODE_DOWN_KNOWN = "its node {nodes} is {state} in Slurm (a node failure, not the process itself)"
SLURM_OOM_KNOWN = (
    "the kernel's out-of-memory killer took it (Slurm's accounting records its step {step} as OUT_OF_MEMORY)"
)
OOM_CAUSE = (
    "out of memory ({signal})"  # a record's cause when hpc_train knows of the OOM kill: "out of memory (SIGKILL)"
)


SIGNAL_NUMBERS = frozenset(int(number) for number in signal.Signals)


def _signal_words(number: int) -> Tuple[str, str]:
    """The signal's name and what usually sends it (": ..." or "")."""
    try:
        name = signal.Signals(number).name
    except ValueError:
        name = f"signal {number}"
    if number == signal.SIGKILL:
        return name, (
            ": usually the kernel's out-of-memory killer, but a node failure, a `kill -9` (yours or an"
            " administrator's), `scancel --signal=KILL` or a container runtime's stop end a process the same way;"
            " to tell: the kernel log on that node (`dmesg -T | grep -i oom`), `sacct -j <id> -o"
            " State,MaxRSS,ReqMem` (OUT_OF_MEMORY) and the node's state (`sinfo -n <node>`)"
        )
    if number == signal.SIGSEGV:
        return name, ": a crash in native code (a C/CUDA extension, a driver)"
    return name, ""
