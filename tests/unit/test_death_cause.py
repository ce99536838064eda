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
