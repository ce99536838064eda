"""The cluster's answers a command asks once (its configuration, sinfo's nodes) are remembered for a while, not for
the life of the process: a notebook's kernel or the Python API lives for hours, and a cluster's nodes and limits
change under it (a drained node, a raised MaxArraySize, a test session's cluster restarted with 16 nodes)."""

from __future__ import annotations

from hpc_train.launch.planning import capacity, sweep_limits
from hpc_train.slurm import slurm_cli


def _counting():
    asked = []

    @slurm_cli.remembered
    def ask() -> int:
        asked.append(1)
        return len(asked)

    return ask, asked


def test_one_command_asks_once(monkeypatch):
    clock = [1000.0]
    monkeypatch.setattr(slurm_cli.time, "monotonic", lambda: clock[0])
    ask, asked = _counting()
    assert [ask(), ask()] == [1, 1]
    clock[0] += slurm_cli.REMEMBER_S  # at the limit: still the same answer
    assert ask() == 1 and len(asked) == 1


def test_a_process_that_lives_on_asks_again(monkeypatch):
    clock = [1000.0]
    monkeypatch.setattr(slurm_cli.time, "monotonic", lambda: clock[0])
    ask, asked = _counting()
    assert ask() == 1
    clock[0] += slurm_cli.REMEMBER_S + 1
    assert ask() == 2 and len(asked) == 2


def test_forgetting_asks_again_at_once():
    ask, asked = _counting()
    assert ask() == 1
    slurm_cli.forget_answers()
    assert ask() == 2


def test_the_planners_questions_are_remembered_this_way():
    """sinfo's nodes and scontrol's configuration: the two questions a sweep asks once."""
    for question in (capacity.answer, sweep_limits.controller_config):
        assert question.__code__ is slurm_cli.remembered(lambda: 0).__code__  # the wrapper, not a cache of its own
