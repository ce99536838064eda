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
    assert line.endswith("; 6 more drop(s) and rejoin(s) in metrics.jsonl")


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
