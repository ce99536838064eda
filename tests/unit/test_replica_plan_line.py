"""The launch's line on the replica groups, under the layout line of a dry run or a start: the typed plan's words,
its group sizes from the one layout arithmetic (contracts.job_layout.group_layout)."""

from __future__ import annotations

from hpc_train.contracts.job_layout import JobLayout
from hpc_train.contracts.replica_plan import replica_plan

NODE = {
    "replica_groups": 3,
    "min_replicas": 1,
    "timeout_s": 60,
    "heartbeat_timeout_s": 5,
    "spare_nodes": 1,
    "max_restarts": 3,
}


def _line(nodes: int, tasks_per_node: int, slurm: bool, node=NODE) -> str:
    layout = JobLayout("ddp", nodes, tasks_per_node, gpus_per_node=0, gpus_per_task=0, cpus_per_task=1)
    return replica_plan(layout, node, "/run").launch_line(nodes, slurm)


def test_slurm_names_the_groups_nodes_and_the_spare_the_job_holds():
    line = _line(nodes=3, tasks_per_node=2, slurm=True)
    assert line.startswith("3 replica groups of 2 ranks, 1 node(s) each:"), line
    assert "without a heartbeat is dropped after 5 s" in line and line.endswith("1 spare node(s): the job holds 4"), (
        line
    )


def test_locally_there_is_no_spare():
    line = _line(nodes=1, tasks_per_node=6, slurm=False)
    assert line.startswith("3 replica groups of 2 ranks: a group") and "spare" not in line, line


def test_a_group_of_one_rank_is_said_so():
    assert _line(nodes=3, tasks_per_node=1, slurm=True).startswith("3 replica groups of 1 rank, 1 node(s) each:")
