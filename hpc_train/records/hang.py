"""Hung ranks: the progress every rank publishes, which ranks to blame, and the message that says so.

Every rank of a job publishes where it is (``logs/rank<r>.progress.json``: step, phase, the
time it last advanced, a heartbeat) from a thread of its own (hpc_train.compute.runtime.heartbeat).
When no rank has advanced for ``trainer.hang_timeout_s``, the watching rank asks every rank to
dump the Python stacks of all its threads into its log (``faulthandler``; the rank's data
loader workers too), then names the culprits with :func:`diagnose` and ends the job with
:data:`hpc_train.records.rundir.EXIT_HUNG`.

Who is to blame. A rank that waits in a collective (the phase ``collective``, or a stack whose
innermost frame is in ``torch/distributed``, outside an import), or that has finished, waits for
the others. Of the other ranks, those *behind* the furthest one (an earlier step, or an earlier
phase of the same step: data, then forward, then backward, then the optimizer) have not reached
the point the furthest one waits at: they are the culprits, and the furthest ones are named as
waiting for them. When every rank is at the same point outside a collective (a dead file
system, a deadlock in the user's code, a step that sleeps everywhere), every rank is named.

Each culprit's stack is shown as a Python traceback shows it, innermost frame first (as the dumps
list them): ``File "...", line N, in f`` and its line of code, from where the rank is stuck out to
hpc_train's frame that called the user's code; the library frames (the standard library, installed
packages: torch, Hydra) between two shown frames are folded into one ``(N library frames)`` line.
Shared by both sides: no torch here.
"""

from __future__ import annotations

import json
import linecache
import re
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, Iterable, List, NamedTuple, Optional, Sequence, Tuple, Union

from hpc_train.records import rundir

# Phases, in the order a training step goes through them; "collective" (waiting for the other
# ranks) and "setup" (before the first step) stand apart. A script job's ranks are "running".
SETUP, DATA, FORWARD, BACKWARD, FORWARD_BACKWARD, OPTIMIZER = (
    "setup",
    "data",
    "forward",
    "backward",
    "forward-backward",
    "optimizer",
)
EVAL, CHECKPOINT, COLLECTIVE, RUNNING, DONE = "eval", "checkpoint", "collective", "running", "done"
# A replica group waiting for the quorum of its next step (torchft's timeouts govern that wait, not the watchdog's)
QUORUM = "quorum"
_ORDER = {SETUP: 0, DATA: 1, FORWARD: 2, FORWARD_BACKWARD: 2, BACKWARD: 3, OPTIMIZER: 4, EVAL: 5, CHECKPOINT: 6}

AUTO = "auto"
AUTO_FLOOR_S = 300.0  # hang_timeout_s=auto: at least 5 minutes ...
AUTO_STEPS = 20  # ... and at least 20 median steps ...
AUTO_CAP = 0.9  # ... but always before the process group's own timeout (trainer.dist_timeout_s)
FIRST_STEP_FACTOR = 3  # setup and the first step (compilation, warm-up, loading) may take this many timeouts
STACKS_WAIT_S = 10.0  # how long the watcher waits for every rank's stacks
SHOWN_FRAMES = 8  # at most this many frames of a stack in the message (every frame is in the rank's log)
SOURCE_WAIT_S = 2.0  # how long the watcher reads source lines (the file system may be what hangs)

STACKS_BEGIN = "=== hpc-train: stacks of rank {rank} (pid {pid}, host {host}, main thread 0x{main:016x}) {stamp} ==="
STACKS_END = "=== hpc-train: end of stacks of rank {rank} {stamp} ==="
WORKER_HEADER = "--- child process (pid {pid}) of rank {rank} ---"  # a data loader worker, a script's rank
_BEGIN = re.compile(
    r"^=== hpc-train: stacks of rank (\d+) \(pid (\d+), host (\S+), main thread 0x([0-9a-f]+)\) .* ===$"
)
_THREAD = re.compile(r"^(?:Current thread|Thread) 0x([0-9a-f]+) \(most recent call first\):$")
_FRAME = re.compile(r'^\s+File "(.*)", line (\d+) in (.*)$')
_WORKER = re.compile(r"^--- child process \(pid (\d+)\) of rank \d+ ---$")
_IMPORTLIB = "<frozen importlib."  # importlib's frames (any import), as faulthandler and py-spy name them
_LIBRARY = re.compile(r"^<|/(?:site|dist)-packages/|/lib(?:64)?/python\d[.\d]*/")  # <frozen ...>, stdlib, packages
_OWN = str(Path(__file__).parents[1]) + "/"  # hpc_train's own files (installed among the packages, or not)


def timeout_s(setting: Any, median_step_s: Optional[float], dist_timeout_s: Optional[float]) -> Optional[float]:
    """The hang timeout in seconds: a number as given; ``auto`` = max(5 min, 20 median steps), capped at 0.9 x the
    process group's timeout so that the watchdog, not a collective's timeout, speaks first; None: off."""
    if setting is None:
        return None
    if str(setting) != AUTO:
        return float(setting)
    value = max(AUTO_FLOOR_S, AUTO_STEPS * (median_step_s or 0.0))
    return min(value, AUTO_CAP * dist_timeout_s) if dist_timeout_s else value


# -- the progress records ---------------------------------------------------------------------------
@dataclass
class RankProgress:
    rank: int
    host: str
    pid: int
    main_thread: int
    attempt: str
    step: int  # the optimizer step in progress (1-based; 0 before the first)
    phase: str
    since: float  # time.time() of the rank's last advance (a new step or phase)
    beat: float  # time.time() of this record
    step_s: Optional[float] = None  # the rank's median step time so far
    detail: str = ""  # e.g. the eval batch, the script's last line
    warm: bool = False  # has finished a step in this attempt (setup and the first step are allowed longer)

    @property
    def position(self) -> Tuple[int, int]:
        return (self.step, _ORDER.get(self.phase, 0))

    def where(self) -> str:
        at = f" at step {self.step}" if self.step else ""
        return f"{self.phase}{at}"


def write_progress(run_dir: Path, record: RankProgress) -> None:
    """Replace the rank's record (a rename: readers never see half of it; no fsync, it is written every beat)."""
    rundir.write_text_atomic(rundir.rank_progress(run_dir, record.rank), json.dumps(record.__dict__), durable=False)


def read_progress(run_dir: Path, world_size: int, attempt: str, first: int = 0) -> Dict[int, RankProgress]:
    """The records of this attempt, by rank (a rank that has not published yet is missing): ranks `first` to
    `first + world_size - 1` (a replica group's, numbered in the whole job)."""
    records = {}
    for rank in range(first, first + world_size):
        data = rundir.read_json(rundir.rank_progress(run_dir, rank))
        if isinstance(data, dict) and data.get("attempt") == attempt:
            try:
                records[rank] = RankProgress(**data)
            except TypeError:
                continue
    return records


# -- stacks -------------------------------------------------------------------------------------------
class Frame(NamedTuple):
    """One frame of a dump (faulthandler's or py-spy's): where, as a traceback names it."""

    path: str
    line: int
    function: str

    def __str__(self) -> str:
        return f'File "{self.path}", line {self.line}, in {self.function}'


@dataclass
class RankStacks:
    """One rank's dump: each thread's frames (innermost first), the main thread's ident, its workers' main frames."""

    main_thread: int
    threads: Dict[int, List[Frame]] = field(default_factory=dict)
    workers: Dict[int, List[Frame]] = field(default_factory=dict)

    @property
    def main(self) -> List[Frame]:
        return self.threads.get(self.main_thread, [])


def stamp(request_time: float) -> str:
    """Names one dump (the request's time): a log holds the dumps of earlier attempts too."""
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(request_time)) + f" #{int(request_time * 1000) % 100000}"


def parse_stacks(log_text: str, rank: int, stamp_text: str) -> Optional[RankStacks]:
    """The stack dump `stamp_text` of `rank` in its log (None when it is not complete)."""
    end = log_text.rfind(STACKS_END.format(rank=rank, stamp=stamp_text))
    if end < 0:
        return None
    start = log_text.rfind("=== hpc-train: stacks of rank", 0, end)
    lines = log_text[start:end].splitlines()
    head = _BEGIN.match(lines[0]) if lines else None
    if head is None:
        return None
    stacks = RankStacks(main_thread=int(head.group(4), 16))
    frames: Optional[List[Frame]] = None
    worker: Optional[int] = None
    for line in lines[1:]:
        thread = _THREAD.match(line)
        worker_head = _WORKER.match(line)
        frame = _FRAME.match(line)
        if worker_head:
            worker, frames = int(worker_head.group(1)), None
        elif thread:
            frames = []
            if worker is None:
                stacks.threads[int(thread.group(1), 16)] = frames
            else:  # faulthandler lists the newest thread first: a worker's main thread comes last
                stacks.workers[worker] = frames
        elif frame and frames is not None:
            path, line_number, function = frame.groups()
            frames.append(Frame(path, int(line_number), function))
    return stacks


def in_collective(stacks: Optional[RankStacks]) -> bool:
    """The main thread waits inside torch.distributed (a collective, a store, a rendezvous).

    Not while it imports: a script starting up runs torch.distributed's module-level code (DDP's
    constructor alone imports torch._dynamo and torch.distributed.tensor), which waits for nobody.
    """
    return bool(stacks and stacks.main and "/torch/distributed/" in stacks.main[0].path and not importing(stacks.main))


def importing(frames: Sequence[Frame]) -> bool:
    """The thread is inside an import (importlib's frames are on its stack)."""
    return any(frame.path.startswith(_IMPORTLIB) for frame in frames)


# -- a stack as the message shows it -------------------------------------------------------------------
Folded = List[Union[Frame, int]]  # the frames shown, and between them the number of library frames left out


def fold(frames: Sequence[Frame], limit: int = SHOWN_FRAMES) -> Folded:
    """The frames a reader needs, innermost first: where the thread is, then every frame of the user's code (and of
    hpc_train's), each run of library frames between two of them as its length. Ends at hpc_train's frame that
    called the user's code (the frames beyond it are the same in every job) or after `limit` frames."""
    shown: Folded = []
    folded, count, outside = 0, 0, False
    for index, frame in enumerate(frames):
        own = frame.path.startswith(_OWN)
        if index and not own and _LIBRARY.search(frame.path):
            folded += 1
            continue
        shown.extend([folded, frame] if folded else [frame])
        folded, count = 0, count + 1
        if (own and outside) or count == limit:
            break
        outside = outside or not own
    return shown


def source_lines(frames: Iterable[Frame]) -> Dict[Frame, str]:
    """Each frame's line of code, where its file is readable; read by a thread of its own, for at most SOURCE_WAIT_S:
    the files may lie on the file system that hangs, and the message must still be said."""
    found: Dict[Frame, str] = {}

    def read() -> None:
        for frame in frames:
            linecache.checkcache(frame.path)  # the file as it is now, as a traceback reads it
            found[frame] = linecache.getline(frame.path, frame.line).strip()

    reader = threading.Thread(target=read, name="hpc-train-source-lines", daemon=True)
    reader.start()
    reader.join(SOURCE_WAIT_S)
    return dict(found)


def stack_lines(shown: Folded, sources: Dict[Frame, str], indent: str = "      ") -> List[str]:
    """A folded stack as a traceback writes it: each frame, then its line of code indented below it."""
    lines = []
    for item in shown:
        if isinstance(item, int):
            lines.append(f"{indent}({item} library frame{'' if item == 1 else 's'})")
            continue
        lines.append(f"{indent}{item}")
        if sources.get(item):
            lines.append(f"{indent}  {sources[item]}")
    return lines


# -- the verdict -------------------------------------------------------------------------------------
@dataclass
class Verdict:
    culprits: List[int]
    waiting: List[int]
    stalled_s: float


def diagnose(records: Dict[int, RankProgress], stacks: Dict[int, Optional[RankStacks]], now: float) -> Verdict:
    """Which ranks hang (the culprits) and which only wait for them (see the module doc)."""
    ranks = sorted(records)
    waiting = {r for r in ranks if records[r].phase in (COLLECTIVE, DONE) or in_collective(stacks.get(r))}
    rest = [r for r in ranks if r not in waiting]
    if not rest:  # every rank waits in a collective: they disagree on which one (or a peer left it)
        culprits = ranks
        waiting = set()
    else:
        front = max(records[r].position for r in rest)
        behind = [r for r in rest if records[r].position < front]
        culprits = behind or rest
        waiting |= set(rest) - set(culprits)
    stalled = now - max((records[r].since for r in ranks), default=now)
    return Verdict(culprits, sorted(waiting), stalled)


def describe(
    verdict: Verdict,
    records: Dict[int, RankProgress],
    stacks: Dict[int, Optional[RankStacks]],
    timeout: float,
    run_dir: Path,
) -> str:
    """The one message for the launcher's output and the attempt log."""
    ranks = sorted(records)
    everyone = len(verdict.culprits) == len(ranks) and len(ranks) > 1
    lines = [
        f"hpc-train: hang: no rank advanced for {verdict.stalled_s:.0f} s (trainer.hang_timeout_s={timeout:.0f});"
        + (" every rank is stuck" if everyone else f" {_ranks(verdict.culprits)} stuck")
        + ":"
    ]
    shown = {rank: _shown_stacks(stacks.get(rank)) for rank in verdict.culprits}
    sources = source_lines(
        {item for each in shown.values() for _, folded in each or [] for item in folded if isinstance(item, Frame)}
    )
    for rank in verdict.culprits:
        rec = records[rank]
        lines.append(f"  rank {rank} (host {rec.host}, pid {rec.pid}) is stuck in {rec.where()}{_detail(rec)}:")
        if shown[rank] is None:
            lines.append(
                "      (no stacks: its Python interpreter did not answer; try `py-spy dump --pid"
                f" {rec.pid}` on {rec.host})"
            )
            continue
        for pid, folded in shown[rank]:
            if pid is not None:
                lines.append(f"    its child process (pid {pid}):")
            lines.extend(stack_lines(folded, sources))
    if verdict.waiting:
        where = sorted({records[r].where() for r in verdict.waiting})
        lines.append(
            f"  {_ranks(verdict.waiting)} {'is' if len(verdict.waiting) == 1 else 'are'} waiting for"
            f" {'it' if len(verdict.culprits) == 1 else 'them'} ({', '.join(where)}): not the cause."
        )
    lines.append(f"  Every thread's stack of every rank: {run_dir / rundir.LOGS}/rank<r>.log")
    return "\n".join(lines)


def _shown_stacks(stacks: Optional[RankStacks]) -> Optional[List[Tuple[Optional[int], Folded]]]:
    """The rank's main thread (pid None), then each child process that has frames, folded."""
    if stacks is None:
        return None
    children = [(pid, fold(frames)) for pid, frames in stacks.workers.items() if frames]
    return [(None, fold(stacks.main)), *children]


def _ranks(ranks: Sequence[int]) -> str:
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(map(str, ranks))


def _detail(record: RankProgress) -> str:
    return f" ({record.detail})" if record.detail else ""


# -- the request every rank answers ---------------------------------------------------------------------
DUMPING, STOPPING = "dumping", "stopping"


def request(run_dir: Path, state: str, by: int, **extra: Any) -> float:
    """Write the watcher's request; returns its time (which names the stack dump it asks for)."""
    now = time.time()
    rundir.write_json_atomic(rundir.hang_file(run_dir), {"state": state, "by": by, "time": now, **extra})
    return now


def read_request(run_dir: Path, since: float) -> Optional[Dict[str, Any]]:
    """The watcher's request of this attempt (written after `since`, this process's start), if any."""
    data = rundir.read_json(rundir.hang_file(run_dir))
    if isinstance(data, dict) and float(data.get("time", 0)) >= since:
        return data
    return None
