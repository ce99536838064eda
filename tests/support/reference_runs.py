"""Reference runs computed once per pytest session and shared by every test, module and xdist worker that needs
the same one (the uninterrupted run a resumed or requeued run must equal, locally or on Slurm).

A reference is keyed by its exact command (the overrides in order, and the folder it runs from): two fixtures that
run the same command get the same run dir. The first caller runs it under a file lock in the session's temporary
folder (the one all of a run's xdist workers share); the others wait on the lock and read the finished run. A
reference's run dir is read, never written: a test that resumes from its checkpoints copies them first.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
from pathlib import Path
from typing import List, Optional

import pytest

from tests.support.cli import assert_ok, run_cli

DONE = "reference.done"  # written beside the run dir once the run has ended with exit code 0


def session_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The folder of this pytest session's reference runs: under xdist, beside the workers' own temporary folders
    (their common parent, one per session); in a plain session, under its own."""
    base = tmp_path_factory.getbasetemp()
    root = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    folder = root / "reference-runs"
    folder.mkdir(exist_ok=True)
    return folder


def reference_run(tmp_path_factory: pytest.TempPathFactory, args: List[str], cwd: Optional[Path] = None) -> Path:
    """The run dir of `hpc-train ARGS` (from `cwd`), run once in this session."""
    key = hashlib.sha256(json.dumps([list(args), str(cwd or "")]).encode()).hexdigest()[:16]
    folder = session_folder(tmp_path_factory) / key
    folder.mkdir(exist_ok=True)
    with open(folder / "lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another worker running it: wait for its end
        if not (folder / DONE).exists():
            (folder / "command.json").write_text(json.dumps({"args": list(args), "cwd": str(cwd or "")}))
            run_dir = folder / "run"
            assert not run_dir.exists(), f"a reference run failed earlier in this session: {run_dir}"
            assert_ok(run_cli(list(args), run_dir, cwd=cwd))
            (folder / DONE).touch()
    return folder / "run"
