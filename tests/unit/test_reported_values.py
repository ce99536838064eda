"""What a running job has reported of its objective (hpc_train.records.metrics_log.reported_values), as an adaptive
study's stopping form reads it: the report_objective rows, or without any the rows that fill the summary's key."""

from __future__ import annotations

import json

from hpc_train.records.metrics_log import reported_values


def _write(run_dir, rows):
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))


def test_report_objective_rows_win_over_the_rows_of_the_summary_key(tmp_path):
    _write(
        tmp_path,
        [
            {"kind": "train", "step": 1, "loss": 9.0, "time": 10.0},
            {"kind": "objective", "step": 1, "value": 5.0, "time": 10.5},
            {"kind": "objective", "step": 3, "value": 4.0, "time": 11.0},
        ],
    )
    assert reported_values(tmp_path, "train_loss") == [(1, 5.0, 10.5), (3, 4.0, 11.0)]
    assert reported_values(tmp_path, "train_loss", since=10.8) == [(3, 4.0, 11.0)]  # a restarted job's rows only


def test_without_report_objective_the_summary_key_s_rows_are_read(tmp_path):
    _write(
        tmp_path,
        [
            {"kind": "train", "step": 1, "loss": 9.0, "time": 10.0},
            {"kind": "eval", "step": 2, "loss": 7.0, "accuracy": 0.1, "time": 10.5},
            {"kind": "train", "step": 2, "loss": True, "time": 10.6},  # not a number: skipped
            {"kind": "train", "step": 3, "loss": 6.0, "time": 11.0},
        ],
    )
    assert reported_values(tmp_path, "train_loss") == [(1, 9.0, 10.0), (3, 6.0, 11.0)]
    assert reported_values(tmp_path, "eval_accuracy") == [(2, 0.1, 10.5)]
    assert reported_values(tmp_path, "objective") == []  # a script's printed objective: nothing while it runs
    assert reported_values(tmp_path / "none", "train_loss") == []
