"""How a process that died without a word is described: a SIGKILL names the out-of-memory killer as the usual
sender, never as a fact, and how to tell; what hpc_train knows replaces the guess."""

from __future__ import annotations

from hpc_train.records.rank_errors import OOM_KILL_KNOWN, death_cause, is_sigkill, short_cause


def test_a_sigkill_names_the_usual_sender_and_how_to_tell_without_asserting_it():
    for code in (-9, 137):  # as a parent sees it, and as a container runtime or a shell reports it
        said = death_cause(code)
        assert "usually the kernel's out-of-memory killer" in said and "does this" not in said, said
        assert "a node failure" in said and "`kill -9`" in said and "scancel --signal=KILL" in said, said
        assert "dmesg" in said and "`sacct -j <id> -o State,MaxRSS,ReqMem`" in said and "sinfo -n <node>" in said


def test_what_hpc_train_knows_is_said_instead_of_the_guess():
    said = death_cause(-9, OOM_KILL_KNOWN)
    assert said == f"was killed by SIGKILL (signal 9): {OOM_KILL_KNOWN}"
    assert death_cause(137, "its node hpcnode2 is DOWN in Slurm").endswith(
        "SIGKILL): its node hpcnode2 is DOWN in Slurm"
    )


def test_the_short_cause_of_a_record():
    assert [short_cause(code) for code in (-9, 137, -11, 1)] == ["SIGKILL", "SIGKILL", "SIGSEGV", "exit code 1"]
    assert is_sigkill(-9) and is_sigkill(137) and not is_sigkill(1) and not is_sigkill(-15)


def test_a_slurm_step_that_accounting_records_out_of_memory_is_said_to_be_an_oom_kill():
    """The batch host's agent reads sacct's JobID|NodeList|State rows of the job: the last step on the failed group's
    nodes decides; OUT_OF_MEMORY is said as a fact, any other end (or no accounting) leaves the usual cause."""
    from hpc_train.batchhost.groups import last_step, slurm_oom_known
    from hpc_train.records.rank_errors import SLURM_OOM_KNOWN

    rows = [
        ["280", "hpcnode[1-3]", "RUNNING"],
        ["280.batch", "hpcnode1", "RUNNING"],
        ["280.0", "hpcnode[1-2]", "OUT_OF_MEMORY"],  # group 0 on two nodes, killed by its cgroup's OOM killer
        ["280.1", "hpcnode3", "FAILED"],  # group 1, ended by a kill -9
        ["280.2", "hpcnode[1-2]", "CANCELLED by 0"],  # group 0 restarted on the same nodes, then cancelled
    ]
    assert last_step(rows[:3], "280", ["hpcnode2", "hpcnode1"]) == ("280.0", "OUT_OF_MEMORY")
    assert slurm_oom_known(last_step(rows[:3], "280", ["hpcnode1", "hpcnode2"])) == SLURM_OOM_KNOWN.format(step="280.0")
    assert "OUT_OF_MEMORY" in SLURM_OOM_KNOWN and "out-of-memory killer took it" in SLURM_OOM_KNOWN
    assert last_step(rows, "280", ["hpcnode1", "hpcnode2"]) == ("280.2", "CANCELLED")  # the step that ended last
    assert slurm_oom_known(last_step(rows, "280", ["hpcnode3"])) == ""  # FAILED: the usual cause is said
    assert slurm_oom_known(last_step(rows, "280", ["hpcnode4"])) == ""  # no such step: accounting has not got it
    assert slurm_oom_known(None) == ""  # accounting off
    said = death_cause(137, slurm_oom_known(last_step(rows[:3], "280", ["hpcnode1", "hpcnode2"])))
    assert (
        said.endswith(
            "SIGKILL): the kernel's out-of-memory killer took it (Slurm's accounting records its step"
            " 280.0 as OUT_OF_MEMORY)"
        )
        and "usually" not in said
    ), said
