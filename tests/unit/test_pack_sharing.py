"""How a packed sweep's runs are shared out among allocations and placed inside one, and how their states are read
from the pool's records (pure logic: no process, no Slurm)."""

from __future__ import annotations

import time
from pathlib import Path

from hpc_train.launch.backends.slurm.packed import PackShape, share_out_runs
from hpc_train.pack import records
from hpc_train.pack.records import AllocationPlan, PackedRun
from hpc_train.pack.scheduler import Scheduler


def run(job: str, nodes: int = 1, tasks: int = 1, gpus: int = 1, cpus: int = 1) -> PackedRun:
    return PackedRun(job, f"/runs/{job}", "", nodes, tasks, gpus, cpus, ["true"])


def plan(runs, nodes: int = 1, gpus: int = 4, cpus: int = 8, index: int = 0, job_id: str = "100") -> AllocationPlan:
    return AllocationPlan(index, nodes, gpus, cpus, 60, "USR2", 120, 3, list(runs), job_id)


def test_runs_go_in_order_to_the_allocation_with_the_fewest_gpus_so_far():
    shape = PackShape(allocations=2, nodes=1, gpus_per_node=4, cpus_per_node=16, minutes=60, time_key="cluster.time")
    one, four = run("1", gpus=1, cpus=4), run("4", gpus=4, cpus=4)
    assert share_out_runs([one] * 5, shape) == [[0, 2, 4], [1, 3]]
    assert share_out_runs([four, one, one, one], shape) == [[0], [1, 2, 3]]
    assert share_out_runs([one], shape) == [[0]]  # more allocations than runs: only as many as there are runs


def test_runs_without_gpus_are_shared_out_by_their_cpus():
    shape = PackShape(allocations=2, nodes=1, gpus_per_node=4, cpus_per_node=16, minutes=60, time_key="cluster.time")
    assert share_out_runs([run(str(i), gpus=0, cpus=2) for i in range(4)], shape) == [[0, 2], [1, 3]]
    assert share_out_runs([run("a", gpus=0, cpus=16), *[run(str(i), gpus=0, cpus=1) for i in range(3)]], shape) == [
        [0],
        [1, 2, 3],
    ]


def scheduler(tmp_path: Path, the_plan: AllocationPlan, hosts: str = "node1") -> Scheduler:
    return Scheduler(the_plan, tmp_path, {"SLURM_JOB_ID": "100", "SLURM_JOB_NODELIST": hosts})


def test_a_run_is_placed_on_the_first_nodes_with_room_for_its_gpus_and_cpus(tmp_path):
    pool = scheduler(tmp_path, plan([], nodes=2, gpus=4, cpus=8), hosts="node[1-2]")
    pool.nodes[0].gpus = 1
    assert [n.name for n in pool._place(run("a", gpus=2))] == ["node2"]
    assert pool._place(run("b", nodes=2, tasks=2, gpus=1)) is None  # node1 has 1 GPU free, the run wants 2 a node
    assert pool._place(run("c", cpus=9)) is None  # no node has 9 CPUs
    pool.nodes[0].gpus = 4
    assert [n.name for n in pool._place(run("d", nodes=2, tasks=2, gpus=1))] == ["node1", "node2"]


def test_a_run_is_not_started_when_the_longest_completed_run_would_not_end_before_the_signal(tmp_path):
    the_plan = plan([run("0"), run("1")])
    records.write_plan(tmp_path, the_plan)
    pool = scheduler(tmp_path, the_plan)
    pool.end_time = time.time() + 120 + 50  # 50 s left before the signal (signal_delay_s = 120)
    assert pool._time_for(run("1"))  # no run has completed: nothing is known, it starts
    records.append_event(tmp_path, 0, "ended", run="0", state=records.COMPLETED, exit_code=0, seconds=40.0)
    assert pool._time_for(run("1"))
    records.append_event(tmp_path, 0, "ended", run="0", state=records.COMPLETED, exit_code=0, seconds=80.0)
    assert not pool._time_for(run("1"))


def test_states_come_from_the_newest_allocation_listing_a_run_and_an_ended_allocation_cancels_the_rest(tmp_path):
    records.write_plan(tmp_path, plan([run("0"), run("1"), run("2")], index=0, job_id="100"))
    records.append_event(tmp_path, 0, "started", run="0", hosts="node1")
    records.append_event(tmp_path, 0, "ended", run="0", state=records.COMPLETED, exit_code=0, seconds=1.0)
    records.append_event(tmp_path, 0, "started", run="1", hosts="node1")
    records.append_event(tmp_path, 0, "ended", run="1", state=records.FAILED, exit_code=1, seconds=1.0)
    records.append_event(tmp_path, 0, "started", run="2", hosts="node1")
    states = records.run_states(tmp_path)
    assert {job: s.state for job, s in states.items()} == {"0": "COMPLETED", "1": "FAILED", "2": "RUNNING"}
    assert states["2"].hosts == "node1" and states["1"].exit_code == 1
    ended = records.run_states(tmp_path, {"100": True})
    assert ended["2"].state == records.CANCELLED and ended["0"].state == records.COMPLETED
    records.write_plan(tmp_path, plan([run("1"), run("2")], index=1, job_id="200"))  # a rerun of the two
    rerun = records.run_states(tmp_path, {"100": True})
    assert {job: (s.state, s.job_id) for job, s in rerun.items()} == {
        "0": ("COMPLETED", "100"),
        "1": ("WAITING", "200"),
        "2": ("WAITING", "200"),
    }


def test_an_allocation_restarting_leaves_runs_a_newer_allocation_took_over(tmp_path):
    old = plan([run("0"), run("1")], index=0, job_id="100")
    records.write_plan(tmp_path, old)
    records.append_event(tmp_path, 0, "ended", run="0", state=records.FAILED, exit_code=1, seconds=1.0)
    assert [r.job for r in scheduler(tmp_path, old).left()] == ["1"]
    records.write_plan(tmp_path, plan([run("0"), run("1")], index=1, job_id="200"))  # a rerun took both over
    assert scheduler(tmp_path, old).left() == []
