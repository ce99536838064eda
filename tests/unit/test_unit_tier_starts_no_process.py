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
