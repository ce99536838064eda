"""hpc_train.slurm.slurm_cli: how every Slurm command is run (a missing command, a failure and a hang are answers, not
exceptions). The Slurm commands themselves are exercised on the test cluster by the Slurm tests (job states,
attempts, requeue on hang, capacity and sweep limits)."""

import signal
import sys
import time

from hpc_train.slurm import slurm_cli


def test_a_command_that_hangs_is_stopped_at_its_timeout():
    started = time.monotonic()
    done = slurm_cli.run(["sleep", "30"], timeout=0.5)
    assert done.returncode == 124 and slurm_cli.said(done) == "sleep did not answer within 0.5 s"
    assert time.monotonic() - started < 10


def test_a_failure_says_its_first_line_of_stderr_and_query_gives_output_only_on_success():
    done = slurm_cli.run(["sh", "-c", "echo first >&2; echo second >&2; exit 3"])
    assert (done.returncode, slurm_cli.said(done)) == (3, "first")
    assert slurm_cli.query(["sh", "-c", "echo out; exit 1"]) is None
    assert slurm_cli.query(["sh", "-c", "echo 'JobId=7 ExcNodeList=(null)'"]) == "JobId=7 ExcNodeList=(null)\n"


def test_a_command_that_holds_sigterm_outlives_the_sigterm_its_job_gets():
    """``scontrol requeue`` from inside the job it requeues gets the job's SIGTERM, maybe before it has exited with
    Slurm's answer: held, the signal waits until the command has exited (here it sends itself one)."""
    sends_itself_sigterm = [sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGTERM); print(1)"]
    held = slurm_cli.run(sends_itself_sigterm, hold_sigterm=True)
    assert (held.returncode, held.stdout) == (0, "1\n")
    assert slurm_cli.run(sends_itself_sigterm).returncode == -signal.SIGTERM
    assert signal.SIGTERM not in signal.pthread_sigmask(signal.SIG_BLOCK, set())  # the caller's mask is restored
