"""The cluster side of a laptop's commands (hpc_train.remote.serve), run here as real processes: the detached runner
that ``start`` spawns and the record of it that ``follow``, ``result`` and ``interrupt`` read."""

from __future__ import annotations

import time
from pathlib import Path

from hpc_train.remote import serve


def _until(found, limit_s: float = 10.0) -> bool:
    deadline = time.monotonic() + limit_s
    while not found() and time.monotonic() < deadline:
        time.sleep(0.05)
    return bool(found())


def test_a_commands_record_keeps_its_pid_whichever_process_writes_first(tmp_path, monkeypatch):
    """``start`` records the runner it spawned; the runner then records the command's pid (what ``interrupt`` sends
    Ctrl-C to). Here start's record is written late, as on a loaded login node: it must not replace the runner's."""
    monkeypatch.setenv("HOME", str(tmp_path))  # ~/.cache/hpc_train/commands, for this process and the runner
    record, release = tmp_path / ".cache" / "hpc_train" / "commands" / "late.json", tmp_path / "release"
    write = serve._write

    def late(path: Path, data: dict) -> None:  # start's write: after the runner's, where the runner does not wait
        _until(lambda: "pid" in serve._read(record), 3.0)
        write(path, data)

    monkeypatch.setattr(serve, "_write", late)
    waits = f"while not os.path.exists({str(release)!r}): time.sleep(0.05)"  # the command: until told to end
    try:
        serve.start("late", "timeit", ["-n", "1", "-r", "1", "import os, time", waits])
        monkeypatch.setattr(serve, "_write", write)
        assert _until(lambda: "pid" in serve._read(record)), serve._read(record)
        assert serve.interrupt("late")["sent"]
        assert _until(lambda: "code" in serve._read(record))  # Ctrl-C ended the command
    finally:
        release.touch()
