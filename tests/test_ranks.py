"""Rank detection from each source, using crafted environments (pure functions, no processes needed)."""

import pytest

from hpc_train.compute.ranks import PORT_BASE, detect_ranks, port_for_job
from hpc_train.hostlist import expand_hostlist, first_host


@pytest.mark.parametrize(
    "nodelist, hosts",
    [
        ("node01", ["node01"]),
        ("node[01-03,07]", ["node01", "node02", "node03", "node07"]),
        ("gpu[1-2],cpu5", ["gpu1", "gpu2", "cpu5"]),
        ("r[1-2]n[08-09]", ["r1n08", "r1n09", "r2n08", "r2n09"]),
        ("jean-zay-iam[12,40-41]", ["jean-zay-iam12", "jean-zay-iam40", "jean-zay-iam41"]),
    ],
)
def test_expand_hostlist(nodelist, hosts):
    assert expand_hostlist(nodelist) == hosts
    assert first_host(nodelist) == hosts[0]


def test_torchrun_variables_win_over_slurm():
    env = {
        "RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "2",
        "MASTER_ADDR": "10.0.0.5", "MASTER_PORT": "29511",
        "SLURM_PROCID": "0", "SLURM_STEP_NUM_TASKS": "1",
    }
    info = detect_ranks(env)
    assert (info.rank, info.local_rank, info.world_size, info.local_world_size) == (3, 1, 8, 2)
    assert (info.master_addr, info.master_port, info.source) == ("10.0.0.5", 29511, "torchrun")


def test_slurm_multi_node_task():
    env = {
        "SLURM_PROCID": "5", "SLURM_LOCALID": "1", "SLURM_NTASKS": "8", "SLURM_STEP_NUM_TASKS": "8",
        "SLURM_JOB_NODELIST": "node[01-03,07]", "SLURM_STEP_NODELIST": "node[01-03,07]",
        "SLURM_STEP_TASKS_PER_NODE": "2(x4)", "SLURM_JOB_ID": "123456",
    }
    info = detect_ranks(env)
    assert (info.rank, info.local_rank, info.world_size, info.local_world_size) == (5, 1, 8, 2)
    assert info.master_addr == "node01"
    assert info.master_port == PORT_BASE + 123456 % 20000
    assert info.source == "slurm"


def test_slurm_port_differs_between_jobs_on_one_node():
    assert port_for_job("1001") != port_for_job("1002")
    assert port_for_job("4242_7") == port_for_job("42427")  # array ids use their digits


def test_slurm_batch_script_without_srun_is_a_single_process():
    # Inside an sbatch script SLURM_NTASKS says 4 but only one process runs: no srun step, no world of 4.
    env = {"SLURM_PROCID": "0", "SLURM_LOCALID": "0", "SLURM_NTASKS": "4", "SLURM_JOB_NODELIST": "n[1-2]", "SLURM_JOB_ID": "7"}
    info = detect_ranks(env)
    assert (info.world_size, info.source) == (1, "single")


def test_submitit_local_executor():
    env = {"SUBMITIT_LOCAL_GLOBALID": "2", "SUBMITIT_LOCAL_LOCALID": "2", "SUBMITIT_LOCAL_NTASKS": "4", "SUBMITIT_LOCAL_JOB_ID": "999"}
    info = detect_ranks(env)
    assert (info.rank, info.local_rank, info.world_size, info.source) == (2, 2, 4, "submitit")
    assert info.master_addr == "127.0.0.1"
    assert info.master_port == port_for_job("999")


def test_plain_process():
    info = detect_ranks({})
    assert (info.rank, info.local_rank, info.world_size, info.source) == (0, 0, 1, "single")
    assert not info.is_distributed
