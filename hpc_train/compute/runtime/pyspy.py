"""The stacks of another process (a script job's script, and its children), read with ``py-spy dump``.

hpc_train's own ranks dump their stacks with ``faulthandler`` from inside; a user's script is a
program hpc_train does not run code in, so its task (the script's parent, which Linux lets trace
its children) asks py-spy. The output is rewritten in faulthandler's layout, so one parser
(hpc_train.records.hang.parse_stacks) reads both.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import List, Optional

from hpc_train.records import hang

_PROCESS = re.compile(r"^Process (\d+): ")
_THREAD = re.compile(r"^Thread (?:0x)?([0-9a-fA-F]+)\b")
_FRAME = re.compile(r"^\s+(\S.*?) \((.*):(\d+)\)\s*$")
TIMEOUT_S = 30.0


def py_spy() -> Optional[str]:
    """The py-spy program: beside this Python (the venv's bin/), else on PATH."""
    beside = Path(sys.executable).parent / "py-spy"
    return str(beside) if beside.exists() else shutil.which("py-spy")


def dump(pid: int, rank: int) -> List[str]:
    """Lines in faulthandler's layout: the process's threads (its main thread's id is `pid`), then each child's."""
    program = py_spy()
    if program is None:
        return ["(no stacks: py-spy is not installed; pip install py-spy)"]
    try:
        done = subprocess.run(
            [program, "dump", "--pid", str(pid), "--subprocesses", "--full-filenames"],
            capture_output=True,
            text=True,
            timeout=TIMEOUT_S,
        )
    except (OSError, subprocess.TimeoutExpired) as err:
        return [f"(no stacks: py-spy dump --pid {pid}: {err})"]
    if done.returncode != 0:
        return [f"(no stacks: py-spy dump --pid {pid}: {(done.stderr or done.stdout).strip()[:300]})"]
    return rewrite(done.stdout, pid, rank)


def rewrite(text: str, pid: int, rank: int) -> List[str]:
    """py-spy's dump of `pid` (and its children) in faulthandler's layout; apart from dump() so that it is tested."""
    lines: List[str] = []
    for line in text.splitlines():
        process, thread, frame = _PROCESS.match(line), _THREAD.match(line), _FRAME.match(line)
        if process and int(process.group(1)) != pid:
            lines.append(hang.WORKER_HEADER.format(pid=process.group(1), rank=rank))
        elif thread:
            tid = int(thread.group(1), 16 if line.startswith("Thread 0x") else 10)
            lines.append(f"Thread 0x{tid:016x} (most recent call first):")
        elif frame:
            function, path, number = frame.groups()
            lines.append(f'  File "{path}", line {number} in {function}')
    return lines
