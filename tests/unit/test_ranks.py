"""Rank detection from each source, using crafted environments (pure functions, no processes needed)."""

import pytest

from hpc_train.compute.runtime.ranks import describe_tasks, detect_ranks, tasks_per_node, world_mismatch
from hpc_train.launch.backends.local.processes import worker_env
from hpc_train.processes.rank_env import PORT_BASE, PORT_SPAN, STEP_BLOCKS, STEP_PORTS, port_for_job, step_port

# What srun sets for task 5 of an 8-task step on 4 nodes (2 per node).
SRUN_TASK = {
    "SLURM_PROCID": "5",
    "SLURM_LOCALID": "1",
    "SLURM_NODEID": "2",
    "SLURM_NTASKS": "8",
    "SLURM_STEP_NUM_TASKS": "8",
    "SLURM_JOB_NODELIST": "node[01-03,07]",
    "SLURM_STEP_NODELIST": "node[01-03,07]",
    "SLURM_STEP_TASKS_PER_NODE": "2(x4)",
    "SLURM_JOB_ID": "123456",
}
TORCHRUN_RANK = {
    "TORCHELASTIC_RUN_ID": "f00d",
    "RANK": "3",
    "LOCAL_RANK": "1",
    "WORLD_SIZE": "8",
    "LOCAL_WORLD_SIZE": "2",
    "MASTER_ADDR": "10.0.0.5",
    "MASTER_PORT": "29511",
}


def test_torchrun_marker_wins_even_inside_an_srun_step():
    info = detect_ranks({**SRUN_TASK, **TORCHRUN_RANK})  # torchrun started by srun: torchrun's world counts
    assert (info.rank, info.local_rank, info.world_size, info.local_world_size) == (3, 1, 8, 2)
    assert (info.master_addr, info.master_port, info.source) == ("10.0.0.5", 29511, "torchrun")


def test_bare_rank_variables_are_ignored_inside_an_srun_step():
    # RANK/WORLD_SIZE left exported in a shell made every task of the step rank 0 of 1.
    info = detect_ranks({**SRUN_TASK, "RANK": "0", "WORLD_SIZE": "1"})
    assert (info.rank, info.world_size, info.source) == (5, 8, "srun")
    assert "RANK and WORLD_SIZE" in info.note and "ignored" in info.note


def test_bare_rank_variables_outside_srun_are_honoured_with_a_warning():
    info = detect_ranks(
        {"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "h1", "MASTER_PORT": "29400", "SLURM_JOB_ID": "9"}
    )
    assert (info.rank, info.world_size, info.master_addr, info.source) == (1, 2, "h1", "environment")
    assert "RANK" in info.note and "WORLD_SIZE" in info.note


def test_local_launcher_marker_comes_second():
    env = worker_env(rank=1, world=2, port=29333, threads=1)  # what hpc-train's local launcher gives its workers
    assert env["HPC_TRAIN_LOCAL_LAUNCHER"] == "1"
    info = detect_ranks({**env, "SLURM_PROCID": "0", "SLURM_STEP_NUM_TASKS": "1", "SUBMITIT_LOCAL_GLOBALID": "0"})
    assert (info.rank, info.world_size, info.master_port, info.source) == (1, 2, 29333, "local")
    assert detect_ranks({**env, **TORCHRUN_RANK}).source == "torchrun"


def test_local_launcher_strips_an_outer_torchrun_and_slurm_environment(monkeypatch):
    for key, value in {**SRUN_TASK, **TORCHRUN_RANK}.items():
        monkeypatch.setenv(key, value)
    env = worker_env(rank=0, world=2, port=29334, threads=1)
    assert not [k for k in env if k.startswith(("SLURM_", "TORCHELASTIC_"))]
    assert detect_ranks(env).source == "local"


def test_slurm_multi_node_task():
    info = detect_ranks(SRUN_TASK)
    assert (info.rank, info.local_rank, info.world_size, info.local_world_size) == (5, 1, 8, 2)
    assert info.master_addr == "node01"
    assert info.master_port == PORT_BASE + 123456 % PORT_SPAN
    assert info.source == "srun" and info.note == ""


@pytest.mark.parametrize(
    "notation, node, expected", [("3,1", 0, 3), ("3,1", 1, 1), ("4(x2),3", 1, 4), ("4(x2),3", 2, 3), ("2", 0, 2)]
)
def test_local_world_size_is_this_nodes_task_count(notation, node, expected):
    world = str(sum(tasks_per_node(notation)))
    env = {
        "SLURM_PROCID": "1",
        "SLURM_STEP_NUM_TASKS": world,
        "SLURM_NODEID": str(node),
        "SLURM_TASKS_PER_NODE": notation,
        "SLURM_NODELIST": "n[1-3]",
    }
    assert detect_ranks(env).local_world_size == expected
    assert (
        detect_ranks({**env, "SLURM_STEP_TASKS_PER_NODE": notation, "SLURM_TASKS_PER_NODE": "9(x3)"}).local_world_size
        == expected
    )


# What srun sets in `sbatch --nodes=2 --ntasks=3` (read on the Slurm test cluster): Slurm puts 2 tasks on the first
# node and 1 on the second; SLURM_NTASKS_PER_NODE is not set.
UNEVEN_JOB = {
    "SLURM_JOB_ID": "31",
    "SLURM_NTASKS": "3",
    "SLURM_JOB_NODELIST": "hpcnode[1-2]",
    "SLURM_TASKS_PER_NODE": "2,1",
}
UNEVEN_STEP = {
    **UNEVEN_JOB,
    "SLURM_STEP_NUM_TASKS": "3",
    "SLURM_STEP_NODELIST": "hpcnode[1-2]",
    "SLURM_STEP_TASKS_PER_NODE": "2,1",
}


@pytest.mark.parametrize(
    "procid, localid, nodeid, local_world", [("0", "0", "0", 2), ("1", "1", "0", 2), ("2", "0", "1", 1)]
)
def test_uneven_step_gives_each_rank_its_real_local_layout(procid, localid, nodeid, local_world):
    info = detect_ranks({**UNEVEN_STEP, "SLURM_PROCID": procid, "SLURM_LOCALID": localid, "SLURM_NODEID": nodeid})
    assert (info.rank, info.local_rank, info.world_size, info.local_world_size) == (
        int(procid),
        int(localid),
        3,
        local_world,
    )
    assert info.master_addr == "hpcnode1" and info.source == "srun"
    assert info.node_tasks == (2, 1) and info.uneven
    assert info.tasks_layout == "2 on hpcnode1, 1 on hpcnode2"
    assert "unevenly (2 on hpcnode1, 1 on hpcnode2)" in info.note
    assert f"local rank {localid} of the {local_world} task(s) on this node" in info.note


def test_cyclic_distribution_keeps_slurms_local_ids():
    # `srun -n3 -m cyclic`: rank 1 on the second node, rank 2 back on the first as its local task 1.
    info = detect_ranks({**UNEVEN_STEP, "SLURM_PROCID": "2", "SLURM_LOCALID": "1", "SLURM_NODEID": "0"})
    assert (info.rank, info.local_rank, info.local_world_size) == (2, 1, 2)


def test_repeated_tasks_per_node_form_is_even():
    env = {
        "SLURM_PROCID": "3",
        "SLURM_LOCALID": "1",
        "SLURM_NODEID": "1",
        "SLURM_JOB_ID": "8",
        "SLURM_STEP_NUM_TASKS": "4",
        "SLURM_STEP_TASKS_PER_NODE": "2(x2)",
        "SLURM_STEP_NODELIST": "hpcnode[1-2]",
    }
    info = detect_ranks(env)
    assert (info.rank, info.local_rank, info.world_size, info.local_world_size) == (3, 1, 4, 2)
    assert info.node_tasks == (2, 2) and not info.uneven
    assert info.tasks_layout == "2 on each of 2 nodes" and info.note == ""


def test_step_variables_win_over_the_jobs():
    # `srun -n3` inside `--nodes=2 --ntasks-per-node=2`: the job's variables still say 4 tasks, 2 per node.
    job = {
        "SLURM_JOB_ID": "9",
        "SLURM_NTASKS": "4",
        "SLURM_NTASKS_PER_NODE": "2",
        "SLURM_TASKS_PER_NODE": "2(x2)",
        "SLURM_JOB_NODELIST": "hpcnode[1-2]",
        "SLURM_NODELIST": "hpcnode[1-2]",
        "SLURM_JOB_NUM_NODES": "2",
    }
    step = {"SLURM_STEP_NUM_TASKS": "3", "SLURM_STEP_TASKS_PER_NODE": "2,1", "SLURM_STEP_NODELIST": "hpcnode[1-2]"}
    info = detect_ranks({**job, **step, "SLURM_PROCID": "2", "SLURM_LOCALID": "0", "SLURM_NODEID": "1"})
    assert (info.world_size, info.local_world_size, info.node_tasks) == (3, 1, (2, 1))
    # A step on a subset of the job's nodes (`srun -N1 -n2 -w hpcnode2`): SLURM_NODEID counts within the step.
    subset = {"SLURM_STEP_NUM_TASKS": "2", "SLURM_STEP_TASKS_PER_NODE": "2", "SLURM_STEP_NODELIST": "hpcnode2"}
    info = detect_ranks({**job, **subset, "SLURM_PROCID": "1", "SLURM_LOCALID": "1", "SLURM_NODEID": "0"})
    assert (info.world_size, info.local_world_size, info.master_addr) == (2, 2, "hpcnode2")
    assert info.tasks_layout == "2 on hpcnode2"


@pytest.mark.parametrize(
    "change, words",
    [
        (
            {"SLURM_STEP_TASKS_PER_NODE": "2(x2)"},
            "SLURM_STEP_TASKS_PER_NODE=2(x2) adds up to 4 task(s), but SLURM_STEP_NUM_TASKS=3",
        ),
        ({"SLURM_NODEID": "2"}, "SLURM_NODEID=2, but SLURM_STEP_TASKS_PER_NODE=2,1 lists 2 node(s)"),
        ({"SLURM_LOCALID": "1"}, "SLURM_PROCID=2 / SLURM_LOCALID=1 do not fit a step of 3 task(s) with 1 on this node"),
        ({"SLURM_PROCID": "3"}, "SLURM_PROCID=3"),
        ({"SLURM_STEP_TASKS_PER_NODE": "2,x"}, "cannot read Slurm's tasks-per-node value '2,x'"),
    ],
)
def test_contradictory_step_variables_are_refused_not_guessed(change, words):
    env = {**UNEVEN_STEP, "SLURM_PROCID": "2", "SLURM_LOCALID": "0", "SLURM_NODEID": "1", **change}
    with pytest.raises(ValueError) as err:
        detect_ranks(env)
    assert words in str(err.value)


def test_a_step_with_fewer_tasks_than_planned_is_refused_naming_its_layout():
    env = {**UNEVEN_STEP, "SLURM_PROCID": "2", "SLURM_LOCALID": "0", "SLURM_NODEID": "1"}
    problem = world_mismatch(detect_ranks(env), 4, env)
    assert problem.startswith(
        "this job was planned for 4 rank(s), but this srun step runs 3 task(s) (2 on hpcnode1, 1 on hpcnode2); this"
        " process is rank 2 of 3. Fix: "
    )
    assert "srun -n 4" in problem and "--ntasks=3 over several nodes spreads the tasks unevenly" in problem
    assert "plan the job for 3 rank(s)" in problem


def test_a_step_with_the_planned_task_count_runs_however_it_is_spread():
    env = {**UNEVEN_STEP, "SLURM_PROCID": "0", "SLURM_LOCALID": "0", "SLURM_NODEID": "0"}
    assert world_mismatch(detect_ranks(env), 3, env) is None


def test_describe_tasks_stays_short_on_big_steps():
    hosts = [f"gpu{i:03d}" for i in range(64)]
    assert describe_tasks([4] * 64, hosts) == "4 on each of 64 nodes"
    assert describe_tasks([4] * 63 + [3], hosts) == "4 on each of 63 nodes, 3 on gpu063"
    assert describe_tasks([4] * 58 + [3] * 6, hosts).endswith("3 on gpu061 and 2 more")
    assert describe_tasks([3], ["hpcnode1"]) == "3 on hpcnode1"
    assert describe_tasks([2, 1], []) == "2 on node 0, 1 on node 1"  # no step node list to name them


def test_tasks_per_node_notation():
    assert tasks_per_node("4(x2),3") == [4, 4, 3]
    with pytest.raises(ValueError, match="4x2"):
        tasks_per_node("4x2")


def test_rendezvous_host_from_slurm_nodelist_when_the_others_are_missing():
    env = {"SLURM_PROCID": "0", "SLURM_STEP_NUM_TASKS": "2", "SLURM_NODELIST": "gpu[07-08]", "SLURM_JOB_ID": "5"}
    assert detect_ranks(env).master_addr == "gpu07"


def test_malformed_nodelist_names_the_list():
    env = {"SLURM_PROCID": "0", "SLURM_STEP_NUM_TASKS": "2", "SLURM_STEP_NODELIST": "node[1-3", "SLURM_JOB_ID": "5"}
    with pytest.raises(ValueError, match=r"node\[1-3"):
        detect_ranks(env)


def test_rendezvous_ports_stay_below_the_ephemeral_range():
    ports = [port_for_job(str(job)) for job in range(0, 200000, 7)]
    assert min(ports) >= PORT_BASE and max(ports) <= 32767  # Linux's ephemeral range is 32768-60999
    assert port_for_job("1001") != port_for_job("1002")
    assert (
        len({port_for_job(str(job)) for job in range(5000, 5000 + PORT_SPAN)}) == PORT_SPAN
    )  # neighbours never collide
    assert port_for_job("4242_7") == port_for_job("42427")  # array ids use their digits


def test_the_ports_of_a_jobs_steps_are_no_other_jobs():
    """A job of replica groups and a packed allocation give their steps ports of their own (step_port): never the port
    of another job, which may run beside them on the same node (the next jobs' ports were theirs when they followed
    the job's own: a job of replica groups made the next job's rank 0 fail with EADDRINUSE), nor the steps' ports of
    the jobs queued just before or after."""
    job = 4333
    steps = [step_port(str(j), k) for j in range(job, job + STEP_BLOCKS) for k in range(STEP_PORTS)]
    jobs = {port_for_job(str(j)) for j in range(PORT_SPAN)}  # every job's own port
    assert not jobs & set(steps)
    assert len(set(steps)) == len(steps)
    assert min(steps) >= 1024 and max(steps) <= 32767  # unprivileged, below the ephemeral range
    with pytest.raises(ValueError, match="step"):
        step_port(str(job), STEP_PORTS)


def test_slurm_batch_script_without_srun_is_a_single_process():
    # Inside an sbatch script SLURM_NTASKS says 4 but only one process runs: no srun step, no world of 4.
    env = {
        "SLURM_PROCID": "0",
        "SLURM_LOCALID": "0",
        "SLURM_NTASKS": "4",
        "SLURM_JOB_NODELIST": "n[1-2]",
        "SLURM_JOB_ID": "7",
    }
    info = detect_ranks(env)
    assert (info.world_size, info.source) == (1, "single")
    problem = world_mismatch(info, 4, env)
    assert "planned for 4 rank(s)" in problem and "srun -n 4" in problem


def test_world_mismatch_is_none_when_the_world_fits():
    assert world_mismatch(detect_ranks(SRUN_TASK), 8, SRUN_TASK) is None
    assert "srun -n 16" in world_mismatch(detect_ranks(SRUN_TASK), 16, SRUN_TASK)


def test_submitit_local_executor():
    env = {
        "SUBMITIT_LOCAL_GLOBALID": "2",
        "SUBMITIT_LOCAL_LOCALID": "2",
        "SUBMITIT_LOCAL_NTASKS": "4",
        "SUBMITIT_LOCAL_JOB_ID": "999",
    }
    info = detect_ranks(env)
    assert (info.rank, info.local_rank, info.world_size, info.source) == (2, 2, 4, "submitit")
    assert info.master_addr == "127.0.0.1"
    assert info.master_port == port_for_job("999")
    assert detect_ranks({**env, "RANK": "0", "WORLD_SIZE": "1"}).source == "submitit"  # before bare variables


def test_plain_process():
    info = detect_ranks({})
    assert (info.rank, info.local_rank, info.world_size, info.source) == (0, 0, 1, "single")
    assert not info.is_distributed
