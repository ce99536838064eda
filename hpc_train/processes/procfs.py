"""Linux's process table, read from ``/proc``: one process's status fields, every process's parent, and the OOM kills
its cgroup counted.

Three readers need it without ``psutil``: the run-dir claim (is the holder alive, and the same process), the hang
watchdog (a rank's data loader workers) and a script job's startup probe (bytes read by the script's process tree);
the local launchers ask whether the out-of-memory killer took a rank that died of SIGKILL.
"""

from __future__ import annotations

import os
from typing import Dict, List, Optional


def stat_fields(pid: int) -> Optional[List[str]]:
    """The fields of ``/proc/<pid>/stat`` after the command name (state first, then the parent's pid); None when there
    is no such process. The command name may hold spaces and parentheses: the fields start after its last ``)``."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            stat = handle.read()
    except OSError:
        return None
    return stat[stat.rfind(")") + 2 :].split()


def parents() -> Dict[int, int]:
    """Every live process's pid -> its parent's pid."""
    found = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return found
    for entry in entries:
        if not entry.isdigit():
            continue
        fields = stat_fields(int(entry))
        if fields and len(fields) > 1 and fields[1].isdigit():
            found[int(entry)] = int(fields[1])
    return found


def children(pid: int) -> List[int]:
    """The processes whose parent is `pid`."""
    return sorted(child for child, parent in parents().items() if parent == pid)


def descendants(pid: int) -> List[int]:
    """`pid` and every process below it."""
    table = parents()
    tree, todo = [], [pid]
    while todo:
        here = todo.pop()
        tree.append(here)
        todo.extend(child for child, parent in table.items() if parent == here)
    return tree


def oom_kills(pid: int = 0) -> Optional[int]:
    """How many processes the kernel's out-of-memory killer has taken in the memory cgroup of `pid` (0: this
    process): cgroup v2's ``memory.events`` or v1's ``memory.oom_control`` (their ``oom_kill`` line); None where
    neither can be read."""
    try:
        with open(f"/proc/{pid or 'self'}/cgroup") as handle:
            lines = [line.rstrip("\n").split(":", 2) for line in handle]
    except OSError:
        return None
    places = []
    for _, controllers, path in (line for line in lines if len(line) == 3):
        if controllers == "":  # v2 (or the unified part of a hybrid)
            places += [f"/sys/fs/cgroup{path.rstrip('/')}/memory.events"]
        elif "memory" in controllers.split(","):
            places += [f"/sys/fs/cgroup/memory{path.rstrip('/')}/memory.oom_control"]
    for place in places:
        try:
            with open(place) as handle:
                for line in handle:
                    key, _, value = line.partition(" ")
                    if key == "oom_kill":
                        return int(value)
        except (OSError, ValueError):
            continue
    return None
