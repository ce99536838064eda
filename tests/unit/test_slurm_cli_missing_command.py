"""hpc_train.slurm.slurm_cli: a missing command is a failed process and no answer, not an exception."""

from hpc_train.slurm import slurm_cli


def test_a_missing_command_is_a_failed_process_and_no_answer():
    done = slurm_cli.run(["hpc-train-no-such-command", "x"])
    assert (done.returncode, slurm_cli.said(done)) == (127, "hpc-train-no-such-command: command not found")
    assert slurm_cli.query(["hpc-train-no-such-command"]) is None
