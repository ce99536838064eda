"""What a run made of replica groups (fault_tolerance.replica_groups) writes about its groups, without a process: the
drop and rejoin rows, the summary's counts, the closing line's words, and hpc-train-report's line on a run dir (that
the report imports no torch takes a process: tests/e2e/test_replica_groups.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict, List

from hpc_train.launch.backends.run import report_summary
from hpc_train.records import replicas, rundir
from hpc_train.report import command


def drop(group: int, step: int, live: int = 2) -> Dict[str, Any]:
    return replicas.event_row(replicas.DROPPED, group, step, 1000.0 + step, live)


def rejoin(group: int, step: int, live: int = 3) -> Dict[str, Any]:
    return replicas.event_row(replicas.REJOINED, group, step, 1000.0 + step, live)


TRAIN = {"kind": "train", "step": 21, "loss": 2.0}
SUMMARY = {replicas.GROUPS: 3, replicas.FEWER_STEPS: 22}


def test_a_drop_or_rejoin_row_names_its_group_step_time_and_the_groups_that_took_the_step():
    assert replicas.event_row("dropped", 1, 21, 17.5, 2) == {
        "kind": "replica",
        "event": "dropped",
        "group": 1,
        "step": 21,
        "s": 17.5,
        "groups": 2,
    }
    assert json.loads(json.dumps(drop(1, 21))) == drop(1, 21)  # a metrics.jsonl line as it is


def test_the_changes_between_two_steps_memberships_list_the_dropped_groups_first():
    assert replicas.changes({0, 1, 2}, {0, 1, 2}) == []
    assert replicas.changes({0, 1, 2}, {0, 2}) == [("dropped", 1)]
    assert replicas.changes([0, 2], [0, 1, 2]) == [("rejoined", 1)]
    assert replicas.changes({0, 1, 3}, {0, 2, 1}) == [("dropped", 3), ("rejoined", 2)]


def test_the_log_line_of_a_drop_and_of_a_rejoin():
    dropped = replicas.event_log_line("dropped", 1, 21, 2, 3)
    rejoined = replicas.event_log_line("rejoined", 1, 43, 3, 3)
    assert dropped == "replica group 1 dropped at step 21: 2 of 3 groups train on"
    assert rejoined == "replica group 1 rejoined at step 43: 3 of 3 groups train"


def test_the_closing_note_is_empty_without_groups_and_says_none_dropped_when_none_was():
    assert replicas.summary_note({"global_step": 20}) == ""
    none = {replicas.GROUPS: 3, replicas.FEWER_STEPS: 0, replicas.DROPS: 0, replicas.REJOINS: 0}
    assert replicas.summary_note(none) == "; 3 replica groups, none dropped"


def test_the_closing_note_gives_the_summarys_counts():
    with_counts = {**SUMMARY, replicas.DROPS: 1, replicas.REJOINS: 1}
    words = "; 3 replica groups: 1 drop(s), 1 rejoin(s), 22 step(s) with fewer groups"
    assert replicas.summary_note(with_counts) == words
    unreturned = {**SUMMARY, replicas.DROPS: 1, replicas.REJOINS: 0}
    assert replicas.summary_note(unreturned) == words.replace("1 rejoin(s)", "0 rejoin(s)")


def test_the_report_line_names_each_groups_drops_and_rejoins_in_step_order():
    rows = [rejoin(1, 43), TRAIN, drop(1, 21)]  # out of order: sorted by step
    assert replicas.report_line(SUMMARY, rows) == (
        "replica groups: 3; 22 step(s) with fewer groups; group 1 dropped at step 21, rejoined at step 43"
    )
    rows = [drop(1, 21), drop(2, 21, live=1), rejoin(2, 30), rejoin(1, 43), drop(1, 50)]
    assert replicas.report_line({replicas.GROUPS: 3, replicas.FEWER_STEPS: 40}, rows) == (
        "replica groups: 3; 40 step(s) with fewer groups; group 1 dropped at step 21, rejoined at step 43,"
        " dropped at step 50; group 2 dropped at step 21, rejoined at step 30"
    )


def test_the_report_line_without_groups_without_drops_and_with_a_group_that_never_came_back():
    assert replicas.report_line({"global_step": 20}, [drop(1, 2)]) == ""
    assert replicas.report_line({replicas.GROUPS: 2, replicas.FEWER_STEPS: 0}, [TRAIN]) == (
        "replica groups: 2; none dropped"
    )
    assert replicas.report_line({replicas.GROUPS: 2, replicas.FEWER_STEPS: 9}, [drop(1, 12, live=1)]) == (
        "replica groups: 2; 9 step(s) with fewer groups; group 1 dropped at step 12"
    )


def test_the_report_line_names_the_first_events_and_counts_the_rest():
    rows: List[Dict[str, Any]] = []
    for n in range(8):  # 16 events
        rows += [drop(1, 10 * n + 1), rejoin(1, 10 * n + 5)]
    line = replicas.report_line({replicas.GROUPS: 2, replicas.FEWER_STEPS: 32}, rows)
    assert line.count("dropped at step") + line.count("rejoined at step") == replicas.EVENTS_SHOWN
    assert line.endswith("; 6 more event(s) in metrics.jsonl")


# -- failures and restarts, as the groups' launcher saw them ----------------------------------------------------
def failure(group: int, step: int, who: str = "rank 5", cause: str = "SIGKILL") -> Dict[str, Any]:
    return replicas.event_row(replicas.FAILED, group, step, 1000.0 + step, 2, who=who, cause=cause, waited_s=5.2)


FAILED = {
    **SUMMARY,
    replicas.FEWER_STEPS: 0,
    replicas.FAILURES: 1,
    replicas.RESTARTS: 1,
    replicas.REJOINS: 1,
    replicas.WAITED: 6.04,
    replicas.HISTORY: [{"group": 2, "step": 356, "who": "rank 5", "cause": "SIGKILL", "rejoined": 357}],
}


def test_a_failure_that_no_step_missed_is_in_the_closing_line_with_the_others_wait():
    assert replicas.summary_note(FAILED) == (
        "; 3 replica groups: group 2 failed once (rank 5, SIGKILL) and rejoined at step 357; the others waited 6.0 s"
    )
    twice = {
        **FAILED,
        replicas.FEWER_STEPS: 4,
        replicas.HISTORY: [
            {"group": 2, "step": 3, "who": "rank 5", "cause": "SIGKILL", "rejoined": 3},
            {"group": 2, "step": 9, "who": "hpcnode3", "cause": "exit code 1", "rejoined": None},
        ],
    }
    assert replicas.summary_note(twice) == (
        "; 3 replica groups: group 2 failed 2 times (rank 5, SIGKILL; hpcnode3, exit code 1) and did not rejoin;"
        " 4 step(s) with fewer groups; the others waited 6.0 s"
    )


def test_the_report_line_names_a_failure_its_restart_and_the_wait_in_the_order_they_happened():
    restarted = replicas.event_row(replicas.RESTARTED, 2, 356, 1356.0, 2, restart=1)
    rows = [rejoin(2, 357), restarted, failure(2, 356), TRAIN]
    assert replicas.report_line(FAILED, rows) == (
        "replica groups: 3; 0 step(s) with fewer groups; the others waited 6.0 s;"
        " group 2 failed at step 356 (rank 5, SIGKILL), restarted at step 356, rejoined at step 357"
    )


def test_the_launchers_events_file_is_read_in_whole_lines(tmp_path):
    replicas.append_event(tmp_path / "a", replicas.FAILED, 1, 5.0, who="rank 1", cause="SIGKILL", restart=0)
    replicas.append_event(tmp_path / "a", replicas.RESTARTED, 1, 6.0, restart=1)
    with open(tmp_path / "a" / replicas.EVENTS, "a") as handle:
        handle.write('{"event": "fail')  # a line being written
    assert replicas.read_events(tmp_path / "a") == [
        {"event": "failed", "group": 1, "s": 5.0, "who": "rank 1", "cause": "SIGKILL", "restart": 0},
        {"event": "restarted", "group": 1, "s": 6.0, "restart": 1},
    ]
    assert replicas.read_events(tmp_path / "none") == []


# -- the report and the closing line on a run dir ------------------------------------------------------------
def run_dir_of(tmp_path: Path, summary: Dict[str, Any], rows: List[Dict[str, Any]]) -> Path:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    base = {
        "strategy": "fsdp",
        "world_size": 6,
        "global_step": 60,
        "train_loss": 0.25,
        "eval_accuracy": None,
        "samples_per_sec": 90.0,
        "attempts": 1,
    }
    (run_dir / rundir.SUMMARY).write_text(json.dumps({**base, **summary}))
    (run_dir / rundir.METRICS).write_text("".join(json.dumps(row) + "\n" for row in rows))
    return run_dir


def test_the_report_of_one_run_prints_its_groups_line_below_the_table(tmp_path, capsys):
    run_dir = run_dir_of(tmp_path, {**SUMMARY, replicas.FEWER_STEPS: 22}, [TRAIN, drop(1, 21), rejoin(1, 43)])
    assert command.main([str(run_dir), "--no-png"]) == 0
    out = capsys.readouterr().out.splitlines()
    line = "replica groups: 3; 22 step(s) with fewer groups; group 1 dropped at step 21, rejoined at step 43"
    assert out.count(line) == 1 and out.index(line) > out.index("states: 1 COMPLETED")
    assert command.read_job(run_dir, "run").replicas == line  # --json carries it too


def test_the_report_of_a_run_without_groups_has_no_groups_line(tmp_path, capsys):
    run_dir = run_dir_of(tmp_path, {}, [TRAIN])
    assert command.main([str(run_dir), "--no-png"]) == 0
    assert "replica groups" not in capsys.readouterr().out
    assert command.read_job(run_dir, "run").replicas is None


def test_the_closing_line_of_a_run_with_groups_ends_with_their_note(tmp_path, capsys):
    counts = {**SUMMARY, replicas.DROPS: 1, replicas.REJOINS: 1}
    run_dir = run_dir_of(tmp_path, counts, [TRAIN, drop(1, 21), rejoin(1, 43)])
    counted = json.loads((run_dir / rundir.SUMMARY).read_text())
    report_summary(run_dir, rundir.EXIT_OK)
    done = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("hpc-train: done:"))
    assert done.endswith("; 3 replica groups: 1 drop(s), 1 rejoin(s), 22 step(s) with fewer groups")
    (run_dir / rundir.SUMMARY).write_text(
        json.dumps({**counted, replicas.FEWER_STEPS: 0, replicas.DROPS: 0, replicas.REJOINS: 0})
    )
    (run_dir / rundir.METRICS).write_text(json.dumps(TRAIN) + "\n")
    report_summary(run_dir, rundir.EXIT_OK)
    assert "; 3 replica groups, none dropped" in capsys.readouterr().out
