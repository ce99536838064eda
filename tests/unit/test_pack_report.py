"""hpc-train-report and --watch on a packed sweep's runs, from their records' states (no Slurm, no process): the
state shown, the allocation named, why a run did not complete and its own logs, the watch's ETA."""

import json
import os

from hpc_train.pack import records
from hpc_train.pack.records import RunState
from hpc_train.report import command, packed_runs, watch


def failed_run(tmp_path, name="5", allocation="8050"):
    """A run dir as a failed packed run leaves it: its rank's error record and its step's stderr."""
    run_dir = tmp_path / name
    (run_dir / "logs").mkdir(parents=True)
    (run_dir / "slurm").mkdir()
    (run_dir / "logs" / "rank0.error.json").write_text(
        json.dumps({"rank": 0, "time": 150.0, "error": "ScriptFailed: told to fail"})
    )
    older = run_dir / "slurm" / f"{allocation}_0_0_log.err"
    older.write_text("an earlier attempt\n")
    os.utime(older, (1, 1))
    (run_dir / "slurm" / f"{allocation}_2_0_log.err").write_text("Traceback\nSystemExit: told to fail\n")
    (run_dir / "slurm" / "9999_1_0_log.err").write_text("another allocation's\n")
    return run_dir


def test_a_failed_runs_why_and_logs_are_its_own(tmp_path):
    run_dir = failed_run(tmp_path)
    state = RunState(records.FAILED, 1, "8050", 1, 100.0, 160.0)
    assert packed_runs.why(run_dir, state) == "ScriptFailed: told to fail"
    assert packed_runs.logs(run_dir, "8050") == [run_dir / "logs/rank0.error.json", run_dir / "slurm/8050_2_0_log.err"]
    # an error record from an earlier attempt is not this one's: the step's stderr says
    assert packed_runs.why(run_dir, RunState(records.FAILED, 1, "8050", 1, 200.0, 210.0)) == "SystemExit: told to fail"
    assert (
        packed_runs.why(tmp_path / "none", RunState(records.FAILED, 1, "8050", 9, 200.0, 210.0))
        == "its job step exited with code 9"
    )
    cancelled = RunState(records.CANCELLED, 1, "8050")
    assert (
        packed_runs.why(tmp_path / "none", cancelled, "TIMEOUT")
        == "its allocation 8050 ended (Slurm: TIMEOUT) before it finished"
    )


def report(name, job_id, status="UNKNOWN", run_dir="/nowhere"):
    return command.JobReport(
        name=name, run_dir=str(run_dir), overrides=[f"x={name}"], slurm_job_id=job_id, status=status
    )


def test_the_report_shows_each_runs_records_state_and_its_allocation(tmp_path):
    run_dir = failed_run(tmp_path)
    jobs = [
        report("0", "8049:0", "COMPLETED"),
        report("1", "8050:1"),
        report("5", "8050:5", run_dir=run_dir),
        report("7", "8049:7"),
    ]
    states = {
        "0": RunState(records.COMPLETED, 0, "8049", 0, 1.0, 2.0),
        "1": RunState(records.RUNNING, 1, "8050", None, 1.0),
        "5": RunState(records.FAILED, 2, "8077", 1, 100.0, 160.0),  # rerun in a later allocation, failed again
        "7": RunState(records.COMPLETED, 0, "8049", 0, 1.0, 2.0),
    }
    for job in jobs:
        command.packed_state(job, states[job.name], {"8049": "RUNNING", "8050": "RUNNING", "8077": "FAILED"})
    assert [(j.status, j.slurm_state, j.allocation) for j in jobs] == [
        ("COMPLETED", "COMPLETED", "8049"),
        ("RUNNING", "RUNNING", "8050"),
        ("FAILED", "FAILED", "8077"),
        ("NO SUMMARY", "COMPLETED", "8049"),  # the records say it completed; its run dir holds no summary
    ]
    header, rows = command.table_rows(jobs)
    assert header[:2] == ["job", "allocation"] and [row[1] for row in rows] == ["8049", "8050", "8077", "8049"]
    assert command.state_counts(jobs) == "2 COMPLETED, 1 FAILED, 1 RUNNING"
    lines = command.failure_lines(jobs)
    assert lines[1] == "  #5 (allocation 8077) FAILED: ScriptFailed: told to fail"
    assert lines[2:] == [f"      log: {run_dir / 'logs/rank0.error.json'}"]  # no step log of allocation 8077 yet


def test_a_run_no_allocation_lists_yet_keeps_its_packed_ids_allocation():
    job = report("3", "8050:3")
    command.packed_state(job, None, {})
    assert (job.allocation, job.slurm_state, job.status) == ("8050", None, "NOT IN QUEUE")


def test_an_unpacked_sweeps_table_keeps_its_slurm_ids():
    header, rows = command.table_rows([report("0", "17_0"), report("1", "17_1")])
    assert header[1] == "slurm id" and [row[1] for row in rows] == ["17_0", "17_1"]


def test_watch_reads_a_packed_runs_state_times_and_failure_from_its_records(tmp_path):
    run_dir = failed_run(tmp_path)
    allocations = {"8050": "RUNNING"}
    waiting = watch.watched_run(tmp_path / "x", "8050:4", "4", RunState(records.WAITING, 1, "8050"), allocations)
    running = watch.watched_run(
        tmp_path / "x", "8050:3", "3", RunState(records.RUNNING, 1, "8050", None, 0.0), allocations
    )
    done = watch.watched_run(
        tmp_path / "x", "8050:1", "1", RunState(records.COMPLETED, 1, "8050", 0, 10.0, 40.0), allocations
    )
    failed = watch.watched_run(
        run_dir, "8050:5", "5", RunState(records.FAILED, 1, "8050", 1, 100.0, 130.0), allocations
    )
    unlisted = watch.watched_run(tmp_path / "x", "8050:6", "6", None, allocations)
    assert [j.state for j in (waiting, running, done, failed, unlisted)] == [
        "WAITING",
        "RUNNING",
        "COMPLETED",
        "FAILED",
        "WAITING",
    ]
    assert (done.elapsed_s, failed.elapsed_s, waiting.elapsed_s) == (30.0, 30.0, None)
    assert failed.allocation == "8050" and failed.error == "ScriptFailed: told to fail"
    assert [failed.log, *failed.more_logs] == [run_dir / "logs/rank0.error.json", run_dir / "slurm/8050_2_0_log.err"]
    jobs = [waiting, running, done, failed, unlisted]
    snap = watch.Snapshot(jobs, {"WAITING": 2, "RUNNING": 1, "COMPLETED": 1, "FAILED": 1})
    assert watch.eta(snap) == 3 * 30.0  # 3 left, 1 running: 3 waves of the finished runs' mean
    assert not snap.done and snap.failed == [failed]
    text = watch.render(tmp_path, snap)
    assert "5 jobs: 1 COMPLETED, 1 RUNNING, 1 FAILED, 2 WAITING; ETA 1m30s" in text
    assert "  #5 (allocation 8050) FAILED: ScriptFailed: told to fail" in text
    assert f"      log: {run_dir / 'slurm/8050_2_0_log.err'}" in text
    assert "8050:3" in text  # the running run, by its packed id


def test_a_hydra_apps_packed_job_shows_its_records_state_and_its_job_returns_value(tmp_path):
    import pickle

    from hydra.core.utils import JobReturn, JobStatus

    from hpc_train.pack import app_step
    from hpc_train.report import app_report

    def job_return(status, value):
        ret = JobReturn()
        ret.status, ret._return_value = status, value
        return ret

    for number, ret in (
        ("0", job_return(JobStatus.COMPLETED, 21.5)),
        ("1", job_return(JobStatus.FAILED, RuntimeError("no 12\nnot 12"))),
    ):
        folder = app_step.run_folder(tmp_path, number)
        folder.mkdir(parents=True)
        (folder / app_step.RETURN_FILE).write_bytes(pickle.dumps(ret))
    (app_step.run_folder(tmp_path, "1") / "slurm").mkdir()
    (app_step.run_folder(tmp_path, "1") / "slurm" / "60_1_0_log.err").write_text("RuntimeError: no 12\n")
    done = RunState(records.COMPLETED, 0, "60", 0, 1.0, 2.0)
    assert app_report.packed_row(tmp_path, "0", done) == ("COMPLETED", "21.5", None)
    failed = RunState(records.FAILED, 0, "60", 1, 1.0, 2.0)
    log = str(app_step.run_folder(tmp_path, "1") / "slurm" / "60_1_0_log.err")
    assert app_report.packed_row(tmp_path, "1", failed) == ("FAILED", "error: not 12", log)
    assert packed_runs.why(app_step.run_folder(tmp_path, "1"), failed) == "error: not 12"  # as --watch says it
    assert app_report.packed_row(tmp_path, "2", RunState(records.WAITING, 0, "60")) == ("WAITING", None, None)
    gone = RunState(records.CANCELLED, 0, "60")
    assert app_report.packed_row(tmp_path, "3", gone) == (
        "CANCELLED",
        "its allocation 60 ended before it finished",
        None,
    )
