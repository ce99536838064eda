"""Linux's process table, read from ``/proc``: one process's status fields, and every process's parent.

Three readers need it without ``psutil``: the run-dir claim (is the holder alive, and the same process), the hang
watchdog (a rank's data loader workers) and a script job's startup probe (bytes read by the script's process tree).
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
