"""The /proc reader against this very process (no process is started: the unit tier's guard holds)."""

import os

from hpc_train.processes import procfs


def test_stat_fields_give_this_process_state_and_parent():
    fields = procfs.stat_fields(os.getpid())
    assert fields is not None and fields[0] in "RS" and int(fields[1]) == os.getppid()


def test_a_pid_that_does_not_exist_has_no_fields():
    assert procfs.stat_fields(2**22 + 12345) is None  # above pid_max's largest value


def test_this_process_is_among_its_parents_children_and_its_tree_starts_with_it():
    assert os.getpid() in procfs.children(os.getppid())
    assert procfs.descendants(os.getpid())[0] == os.getpid()
    assert os.getpid() in procfs.descendants(os.getppid())
