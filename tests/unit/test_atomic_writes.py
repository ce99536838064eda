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


def test_a_record_gets_the_mode_a_plain_write_gives_and_a_stream_goes_through_the_same_way(tmp_path):
    """0666 less the umask, as ``open(path, "w")`` (an OCI bundle's config.json, a remote link); a large file is
    written in pieces through the open handle, with nothing under its name until it is whole."""
    plain = tmp_path / "plain"
    plain.write_text("x")
    path = tmp_path / "image.sif"
    seen = []

    def stream(handle) -> None:
        for _ in range(64):
            handle.write(b"\0" * 65536)
            seen.append(path.exists())

    rundir.write_atomic(path, stream)
    assert path.stat().st_size == 64 * 65536 and not any(seen)
    assert path.stat().st_mode & 0o7777 == plain.stat().st_mode & 0o7777
    assert sorted(p.name for p in tmp_path.iterdir()) == ["image.sif", "plain"]


def test_fsync_is_skipped_only_where_asked_and_a_gone_folder_is_not_made_again(tmp_path, monkeypatch):
    """A heartbeat's progress record (durable=False) is rewritten every beat without an fsync; every other record
    is fsynced, file then folder. The API's refusal file (make_folder=False) is not written into a folder made again
    after the call that named it removed it."""
    synced = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: synced.append(fd) or real_fsync(fd))
    rundir.write_text_atomic(tmp_path / "beat.json", "{}", durable=False)
    assert synced == []
    rundir.write_text_atomic(tmp_path / "record.json", "{}")
    assert len(synced) == 2  # the file, then its folder
    gone = tmp_path / "gone" / "hpc-train.result.json"
    try:
        rundir.write_text_atomic(gone, "{}", make_folder=False)
    except FileNotFoundError:
        pass
    assert not gone.parent.exists()


def test_a_link_and_a_finished_file_replace_what_is_there_in_one_step(tmp_path):
    """link_atomic (an OCI bundle's rootfs link) and replace_atomic (the API's output file, moved into the run dir
    while a job may still write to it: the same file, not a copy)."""
    link = tmp_path / "rootfs"
    rundir.link_atomic(link, "/images/a")
    rundir.link_atomic(link, "/images/b")
    assert os.readlink(link) == "/images/b"
    source = tmp_path / "call" / "hpc-train.out"
    source.parent.mkdir()
    with source.open("w") as still_open:
        still_open.write("first ")
        rundir.replace_atomic(source, tmp_path / "hpc-train.out")
        still_open.write("and later")
    assert (tmp_path / "hpc-train.out").read_text() == "first and later"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["call", "hpc-train.out", "rootfs"]
