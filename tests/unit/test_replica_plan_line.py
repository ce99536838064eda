"""The launch's line on the replica groups, under the layout line of a dry run or a start."""

from __future__ import annotations

from hpc_train.records.replicas import plan_line

NODE = {
    "replica_groups": 3,
    "min_replicas": 1,
    "timeout_s": 60,
    "heartbeat_timeout_s": 5,
    "spare_nodes": 1,
    "max_restarts": 3,
}


def test_slurm_names_the_groups_nodes_and_the_spare_the_job_holds():
    line = plan_line(NODE, world=6, nodes=3, slurm=True)
    assert line.startswith("3 replica groups of 2 ranks, 1 node(s) each:"), line
    assert "without a heartbeat is dropped after 5 s" in line and line.endswith("1 spare node(s): the job holds 4"), (
        line
    )


def test_locally_there_is_no_spare_and_without_groups_nothing_is_said():
    assert "spare" not in plan_line(NODE, world=6, nodes=1, slurm=False)
    assert plan_line({**NODE, "replica_groups": None}, world=6, nodes=1, slurm=False) == ""
    assert plan_line({}, world=6, nodes=1, slurm=True) == ""


def test_a_group_of_one_rank_is_said_so():
    assert plan_line(NODE, world=3, nodes=3, slurm=True).startswith("3 replica groups of 1 rank, 1 node(s) each:")
