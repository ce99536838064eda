"""submitit's log lines come out once on the login side: its logger has a handler on stdout and one on stderr and
hands each record to the root logger too (where Hydra puts one more), so each of its warnings was printed three times
(its sacct warning, every poll, on a cluster without accounting)."""

from __future__ import annotations

import logging

from hpc_train.launch.backends.slurm import submitit_import


def test_a_submitit_warning_is_printed_once(capsys):
    root = logging.getLogger()
    caught = []
    handler = logging.Handler()
    handler.emit = caught.append  # type: ignore[method-assign]
    root.addHandler(handler)  # as Hydra's handler on the root logger
    try:
        submitit_import.submitit_module()
        submitit_import.submitit_module()  # a second submission in the same process adds nothing
        logging.getLogger("submitit").warning("Call #1 - Bypassing sacct error")
    finally:
        root.removeHandler(handler)
    out, err = capsys.readouterr()
    assert out == "" and err.count("Bypassing sacct error") == 1, (out, err)
    assert caught == [], "not handed to the root logger's handlers too"
