"""The unit tier's guard (tests/support/no_process.py, switched on by tests/conftest.py): in tests/unit, starting a
process fails at that call, whichever way it is started."""

from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys

import pytest

from tests.support.no_process import ProcessStarted


def test_a_unit_test_that_starts_a_process_fails_at_that_call():
    with pytest.raises(
        ProcessStarted, match=r"subprocess.Popen \['true'\]: tests/unit holds tests that start no process"
    ):
        subprocess.run(["true"], check=False)
    with pytest.raises(ProcessStarted, match="os.system 'true'"):
        os.system("true")
    with pytest.raises(ProcessStarted, match="multiprocessing"):
        multiprocessing.get_context("spawn").Process(target=sys.exit).start()
    with pytest.raises(ProcessStarted, match="os.posix_spawn"):
        os.posix_spawn("/bin/true", ["true"], {})


def test_the_cli_called_in_process_runs_only_what_starts_nothing(tmp_path):
    """run_cli_in_process takes a dry run, a printing flag or a refusal; a command that would train is refused
    before it is called, and one called as a refusal that goes on to start its ranks fails at that start."""
    from tests.support.cli import TINY, run_cli_in_process

    with pytest.raises(AssertionError, match="may start a run: use run_cli"):
        run_cli_in_process([*TINY, "trainer.max_steps=1"], tmp_path / "run")
    with pytest.raises(AssertionError, match=r"started a process \(subprocess.Popen .*hpc_train.compute.worker"):
        run_cli_in_process([*TINY, "trainer.max_steps=1"], tmp_path / "run", refused=True)
    with pytest.raises(AssertionError, match="was not refused"):
        run_cli_in_process([*TINY, "dry_run=true"], tmp_path / "dry", refused=True)
