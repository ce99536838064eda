"""A full disk while a record is written (hpc_train.records.rundir): one message naming the file and what was kept,
and an append cut short leaves no half line behind (the next append would glue its own line onto it). The write is
cut short in-process: a tmpfs fills on page boundaries, which a unit test cannot aim at (tests/e2e/test_disk_full.py
fills a real one)."""

import errno
import os

import pytest

from hpc_train.records import rundir


def cut_short(monkeypatch) -> None:
    """os.write takes half of what it is given, until one byte is left: then the disk is full."""
    real = os.write

    def write(fd, data):
        if len(data) > 1:
            return real(fd, bytes(data[: len(data) // 2]))
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "write", write)


def test_an_append_cut_short_by_a_full_disk_leaves_the_file_as_it_was_and_names_it(tmp_path, monkeypatch):
    path = tmp_path / rundir.METRICS
    path.write_text('{"step": 1}\n')
    cut_short(monkeypatch)
    with pytest.raises(rundir.RecordNotWritten) as refused:
        with rundir.recording(path, "every row before it is kept whole"):
            rundir.append_whole(path, '{"step": 2, "loss": 0.5}\n')
    assert path.read_text() == '{"step": 1}\n'
    assert str(refused.value).startswith(f"no space left to write metrics.jsonl in {tmp_path}: every row before it")
    assert "Fix: free space" in str(refused.value)


def test_the_attempt_log_is_appended_whole_or_not_at_all(tmp_path, monkeypatch):
    path = tmp_path / rundir.ATTEMPTS
    path.write_text('{"event": "start"}\n')
    cut_short(monkeypatch)
    with pytest.raises(OSError):
        rundir.append_line_durable(path, '{"event": "end"}')
    assert rundir.read_jsonl(path) == [{"event": "start"}] and path.read_text().endswith("\n")


def test_other_errors_pass_unchanged(tmp_path):
    with pytest.raises(PermissionError):
        with rundir.recording(tmp_path / "x", "nothing"):
            raise PermissionError(errno.EACCES, "denied")


def test_a_torn_last_line_is_skipped_by_the_reader(tmp_path):
    path = tmp_path / rundir.METRICS
    path.write_text('{"step": 1}\n{"step": 2, "lo')
    assert rundir.read_jsonl(path) == [{"step": 1}]


def test_a_sweeps_job_table_gets_whole_rows_or_none_and_the_refusal_names_it(tmp_path, monkeypatch):
    from hpc_train.jobs import job_table

    job_table.append(tmp_path, [job_table.JobRow("100_0", "0", "seed=1", "1 node")])
    before = job_table.path_of(tmp_path).read_text()
    cut_short(monkeypatch)
    with pytest.raises(rundir.RecordNotWritten) as refused:
        job_table.append(tmp_path, [job_table.JobRow("100_1", "1", "seed=2", "1 node")])
    assert job_table.path_of(tmp_path).read_text() == before
    assert f"no space left to write jobs.tsv in {tmp_path}: its earlier rows are kept" in str(refused.value)


def test_a_packed_sweeps_plan_on_a_full_disk_is_the_refusal_and_no_temporary_file(tmp_path, monkeypatch):
    from hpc_train.pack import records

    plan = records.AllocationPlan(0, 1, 0, 1, 10, "USR2", 60, 3, [])
    path = records.write_plan(tmp_path, plan)
    before = path.read_text()

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(rundir, "write_bytes_atomic", full)
    with pytest.raises(rundir.RecordNotWritten) as refused:
        records.write_plan(tmp_path, plan)
    assert path.read_text() == before and f"no space left to write {path.name}" in str(refused.value)
