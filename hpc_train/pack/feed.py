"""A packed sweep's feed: runs handed to running allocations one at a time, beside their fixed plans.

An adaptive study with ``launcher.pack`` (hpc_train.tune.packed_trials) submits its allocations once, each with an
empty plan marked ``fed``, and drops each rung it starts into ``<sweep dir>/.hpc_train/pack/feed/`` as one file (a
PackedRun and when it was fed), written atomically. A fed allocation's pool (hpc_train.pack.scheduler) takes a file
only when the run fits its free GPUs and CPUs now, by renaming it into ``feed/claimed/``, its own index in the
name: a rename succeeds once, so exactly one allocation runs it. The pool then records the run in its events
(``claimed``, the run's description with it), so that a run's state is read from the allocations' records as a
planned run's is (hpc_train.pack.records.run_states). ``feed/CLOSED`` says no run comes any more: a fed pool ends
once it is there and its steps have ended (or at its time limit). A fixed plan is a feed closed from the start.
No torch here.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterator, List, Optional

from hpc_train.pack import records
from hpc_train.pack.records import PackedRun
from hpc_train.records import rundir

CLOSED = "CLOSED"
CLAIMED = "claimed"


@dataclass(frozen=True)
class Entry:
    """One fed run: what its step runs, and when it was fed (epoch seconds)."""

    run: PackedRun
    fed: float
    path: Path  # its file, in the feed (or, once claimed, where it was)


def folder(sweep_dir: Path) -> Path:
    return records.folder(sweep_dir) / "feed"


def put(sweep_dir: Path, run: PackedRun) -> Entry:
    """The run in the feed, atomically (a pool never reads half a file); named so that runs are taken in the order
    they were fed."""
    fed = time.time()
    path = folder(sweep_dir) / f"{time.time_ns():020d}_{run.job}.json"
    rundir.write_text_atomic(path, json.dumps({"run": asdict(run), "fed": fed}))
    return Entry(run, fed, path)


def _read(path: Path) -> Optional[Entry]:
    try:
        data = json.loads(path.read_text())
        return Entry(PackedRun(**data["run"]), float(data["fed"]), path)
    except (OSError, ValueError, TypeError, KeyError):
        return None  # claimed by another pool meanwhile (or not ours)


def waiting(sweep_dir: Path) -> Iterator[Entry]:
    """The runs fed and not yet claimed, oldest first."""
    for path in sorted(folder(sweep_dir).glob("*.json")):
        entry = _read(path)
        if entry is not None:
            yield entry


def claim(sweep_dir: Path, entry: Entry, index: int) -> bool:
    """Whether allocation `index` took the run (False: another pool took it first)."""
    target = folder(sweep_dir) / CLAIMED / f"{index}_{entry.path.name}"
    target.parent.mkdir(parents=True, exist_ok=True)
    try:  # a rename succeeds once: the first pool to make it has the run
        rundir.replace_atomic(entry.path, target)
    except FileNotFoundError:
        return False
    return True


def claimed(sweep_dir: Path) -> List[tuple]:
    """(allocation index, entry) of every claimed run, oldest first: what a pool took before it wrote its event."""
    found = []
    for path in sorted((folder(sweep_dir) / CLAIMED).glob("*.json"), key=lambda p: p.name.partition("_")[2] or p.name):
        entry = _read(path)
        if entry is not None:
            found.append((int(path.name.partition("_")[0]), entry))
    return found


def close(sweep_dir: Path) -> None:
    """No run comes any more: the fed pools end once their steps have ended."""
    rundir.write_text_atomic(folder(sweep_dir) / CLOSED, f"{time.time()}\n")


def is_closed(sweep_dir: Path) -> bool:
    return (folder(sweep_dir) / CLOSED).exists()


def withdraw(sweep_dir: Path) -> List[Entry]:
    """The runs fed and not yet claimed, taken out of the feed (none of them starts now)."""
    taken = []
    for entry in list(waiting(sweep_dir)):
        try:
            entry.path.unlink()
        except FileNotFoundError:
            continue
        taken.append(entry)
    return taken
