"""A torchrun-style DDP script that knows nothing of hpc_train, as a two-node job on the Slurm test cluster, with and
without torchrun."""

from __future__ import annotations

import re
import subprocess

import pytest

from tests.e2e.test_scripts_dist import DDP_SCRIPT, STEPS, check_ranks, hpc_train, rank_records
from tests.support.cli import read_summary
from tests.support.slurm import wait_for_job_end

SLURM = ["launcher=slurm", "cluster.cpus_per_gpu=2", "cluster.time=5", "launcher.wait=true"]


EPHEMERAL = range(32768, 61000)  # Linux's default net.ipv4.ip_local_port_range: 32768-60999


def job_nodes(proc: subprocess.CompletedProcess) -> tuple:
    """The Slurm job of this run: its id and its nodes, in Slurm's order (scontrol's hostnames)."""
    job_id = re.search(r"submitted Slurm job (\d+)", proc.stdout).group(1)
    fields = wait_for_job_end(job_id)
    assert fields["JobState"] == "COMPLETED" and fields["NumNodes"] == "2", fields
    nodes = subprocess.run(
        ["scontrol", "show", "hostnames", fields["NodeList"]], capture_output=True, text=True, check=True
    )
    return job_id, nodes.stdout.split()


@pytest.mark.slurm
def test_ddp_script_as_a_two_node_slurm_job(slurm_cluster, tmp_path):
    """strategy=ddp, 2 nodes x 1 GPU: one task per GPU, each execs the script with its own rank."""
    run_dir = tmp_path / "run"
    args = [*SLURM, "strategy=ddp", "resources.nodes=2", "resources.gpus_per_node=1"]
    proc = hpc_train(args, run_dir, [DDP_SCRIPT, f"--steps={STEPS}"])
    job_id, nodes = job_nodes(proc)
    records = rank_records(run_dir, 2)
    check_ranks(records, run_dir, world=2, per_node=1)
    for rank, (r, e) in enumerate((r, r["env"]) for r in records):
        assert r["host"] == nodes[rank] and e["SLURM_PROCID"] == str(rank), (nodes, r)
        assert e["GROUP_RANK"] == e["NODE_RANK"] == str(rank) and e["LOCAL_RANK"] == "0"
        assert e["MASTER_ADDR"] == nodes[0], "the first host of the job's node list"
        port = int(e["MASTER_PORT"])
        assert 1024 < port and port not in EPHEMERAL, port
        assert e["OMP_NUM_THREADS"] == e["SLURM_CPUS_PER_TASK"] == "2"  # cluster.cpus_per_gpu=2 x 1 GPU a task
        assert (
            e["CUDA_VISIBLE_DEVICES"] == e["GPU_DEVICE_ORDINAL"] and len(e["CUDA_VISIBLE_DEVICES"].split(",")) == 1
        ), "as Slurm binds the task's one GPU"
        assert e["SLURM_JOB_ID"] == job_id and e["TORCHELASTIC_RUN_ID"] is None
    summary = read_summary(run_dir)
    assert summary["world_size"] == 2 and summary["attempts"] == 1
    assert summary["script"] == [DDP_SCRIPT, f"--steps={STEPS}"]
    assert sorted(p.name for p in (run_dir / "logs").glob("rank*.log")) == ["rank0.log", "rank1.log"]


@pytest.mark.slurm
def test_ddp_script_under_torchrun_on_two_slurm_nodes(slurm_cluster, tmp_path):
    """script.launcher=torchrun, 2 nodes x 2 GPUs: one task per node runs torchrun, which starts 2 ranks."""
    run_dir = tmp_path / "run"
    args = [*SLURM, "strategy=ddp", "resources.nodes=2", "resources.gpus_per_node=2", "script.launcher=torchrun"]
    proc = hpc_train(args, run_dir, [DDP_SCRIPT])
    job_id, nodes = job_nodes(proc)
    records = rank_records(run_dir, 4)
    check_ranks(records, run_dir, world=4, per_node=2)
    # One torchrun per node (a task each, never G of them), meeting at the job's first node on a port
    # outside the ephemeral range; the rendezvous id is the job's.
    logs = sorted((run_dir / "logs").glob("rank*.log"))
    assert [p.name for p in logs] == ["rank0.log", "rank1.log"]
    endpoints = set()
    for log in logs:
        command = re.search(r"-m torch\.distributed\.run (.*) tests/support/scripts/ddp_allreduce\.py", log.read_text())
        assert command, log.read_text()
        words = command.group(1).split()
        assert words[words.index("--nnodes") + 1] == "2" and words[words.index("--nproc-per-node") + 1] == "2"
        assert words[words.index("--rdzv-backend") + 1] == "c10d" and words[words.index("--rdzv-id") + 1] == job_id
        endpoints.add(words[words.index("--rdzv-endpoint") + 1])
    assert len(endpoints) == 1, endpoints
    host, port = endpoints.pop().rsplit(":", 1)
    assert host == nodes[0] and 1024 < int(port) and int(port) not in EPHEMERAL, (host, port)
    for r in records:
        e = r["env"]
        assert r["host"] in nodes and e["TORCHELASTIC_RUN_ID"] == job_id
        assert r["host"] == nodes[int(e["SLURM_PROCID"])], "each node's one task started that node's ranks"
        # torchrun's own worker variables: its store on its node rank 0 (here the first node), all ranks alike
        assert e["MASTER_ADDR"] == records[0]["host"] == nodes[0]
        assert e["SLURM_CPUS_PER_TASK"] == "4"  # the node's task holds both GPUs' CPUs (2 x cpus_per_gpu=2) ...
        assert e["OMP_NUM_THREADS"] == "2"  # ... shared by its 2 ranks
        visible = e["CUDA_VISIBLE_DEVICES"]
        assert visible == e["GPU_DEVICE_ORDINAL"] and len(visible.split(",")) == 2, "not narrowed: cuda:LOCAL_RANK"
    assert read_summary(run_dir)["world_size"] == 2  # hpc_train's tasks (torchrun agents), one per node
