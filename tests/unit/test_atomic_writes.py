"""The one atomic writer (records/rundir.py): a file is replaced whole, by writers on many nodes and in containers."""

from __future__ import annotations

import os
import threading

from hpc_train.records import rundir


def test_writers_that_share_a_pid_never_share_a_temporary_file(tmp_path, monkeypatch):
    """A container's first process is pid 1 on every node: the claim's refresh by two replica groups' rank 0s, each
    pid 1 in its own container, once renamed the other's temporary file away (FileNotFoundError)."""
    monkeypatch.setattr(os, "getpid", lambda: 1)
    path = tmp_path / ".claim.json"
    names = {rundir.temporary_name(path) for _ in range(100)}
    assert len(names) == 100 and all(name.parent == tmp_path and name.name.startswith(".") for name in names)

    failures = []

    def writer(text: bytes) -> None:
        try:
            for _ in range(50):
                rundir.write_bytes_atomic(text, path)
        except OSError as error:
            failures.append(error)

    threads = [threading.Thread(target=writer, args=(bytes([65 + i]) * 4096,)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert failures == []
    assert path.read_bytes() in (b"A" * 4096, b"B" * 4096)  # one writer's whole file, never a mix
    assert sorted(p.name for p in tmp_path.iterdir()) == [".claim.json"]  # no temporary file left behind
