"""hpc_train.hosts.hosts: one way to run a command, on this machine or over SSH, with what a host that cannot be
reached does chosen by the caller (RAISE: hpc_train.errors.Unreachable with the fix; RETURN: a failed process whose
stderr says why). The SSH side is met for real against a port nothing listens on; the Slurm tier's laptop tests
(tests/slurm/test_from_laptop.py) run it against a real server."""

from __future__ import annotations

import socket
import subprocess

import pytest

from hpc_train.errors import Unreachable
from hpc_train.hosts.hosts import LOCAL, RAISE, RETURN, SshHost
from hpc_train.hosts.ssh import SSH_FAILED


def _closed_port() -> int:
    """A port nothing listens on: one the kernel hands out free, released."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_this_machine_runs_the_command_and_returns_its_own_status_in_bytes_or_text():
    done = LOCAL.run(["sh", "-c", "cat; echo err >&2; exit 3"], stdin=b"in\n")
    assert (done.returncode, done.stdout, done.stderr) == (3, b"in\n", b"err\n")
    done = LOCAL.run(["sh", "-c", "echo $X"], env={"X": "y", "PATH": "/usr/bin:/bin"}, text=True, failure=RETURN)
    assert (done.returncode, done.stdout) == (0, "y\n")


def test_on_this_machine_a_missing_command_or_no_answer_is_a_failed_process_or_raises_as_the_caller_chose():
    missing = LOCAL.run(["hpc-train-no-such-command"], text=True, failure=RETURN)
    assert (missing.returncode, missing.stderr) == (127, "hpc-train-no-such-command: command not found")
    hung = LOCAL.run(["sleep", "30"], timeout=0.3, failure=RETURN)
    assert (hung.returncode, hung.stderr) == (124, b"sleep did not answer within 0.3 s")
    with pytest.raises(subprocess.TimeoutExpired):
        LOCAL.run(["sleep", "30"], timeout=0.3, failure=RAISE)


def test_a_host_ssh_cannot_reach_raises_unreachable_with_the_fix_or_returns_sshs_words():
    host = SshHost(f"ssh://nobody@127.0.0.1:{_closed_port()}")
    with pytest.raises(Unreachable) as refused:
        host.run(["true"])
    assert refused.value.key == "cluster.login"
    assert "cannot be reached" in refused.value.problem and "Connection refused" in refused.value.problem
    returned = host.run(["squeue"], timeout=30, text=True, failure=RETURN)
    assert returned.returncode == SSH_FAILED and returned.stdout == ""
    assert returned.stderr.startswith(f"ssh {host.name}: ") and "Connection refused" in returned.stderr
    with pytest.raises(Unreachable, match="cannot be reached"):
        host.open()  # no master there, and none can be opened
    started = host.popen(["true"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # a streamed command's end
    _, said = started.communicate()
    with pytest.raises(Unreachable, match="cannot be reached"):
        host.check(started.returncode, said.decode())
