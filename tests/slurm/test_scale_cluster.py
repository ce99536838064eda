"""16 nodes of the real local Slurm cluster: ddp over all of them, 16-node layouts, a node failure.

Scale tests: deselected by default, run with ``bash scripts/test.sh -m scale`` (their fixture
``slurm_cluster_16`` restarts the cluster with 16 nodes, hpcnode[01-08] and gpu-a[1-8], and
starts the default 2-node cluster again at the end of the session). Every rank is a real gloo
process on CPU, one thread each; the jobs are as small as a 16-rank job can be.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from pathlib import Path
from typing import Callable, Dict, List

import pytest
import torch

from hpc_train.slurm.hostlist import expand_hostlist, first_host
from tests.slurm.test_requeue_slurm import attempt_endings, restore_node, wait_until_finished_with_summary
from tests.support.cli import (
    TINY,
    assert_bit_identical,
    assert_ok,
    checkpoint_steps,
    final_weights,
    read_summary,
    run_cli,
    wait_for,
)
from tests.support.slurm import scontrol_job, squeue_ids, tres_gpus, wait_for_job_end
from tests.support.slurm_cluster import SCALE_NODELIST, SCALE_NODES, SCALE_PARTITIONS

pytestmark = [pytest.mark.scale, pytest.mark.slurm]

SLURM = ["launcher=slurm", "cluster.cpus_per_gpu=1", "cluster.time=10", "launcher.signal_delay_s=30"]
TRAIN = [*TINY, "trainer.epochs=null", "trainer.eval=false"]


def _job_id(stdout: str) -> str:
    return re.search(r"submitted Slurm job (\d+)", stdout).group(1)


def poll(condition: Callable[[], bool], timeout: float, what: str) -> None:
    """wait_for at one look a second: 16 ranks on a small machine leave little CPU for scontrol."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(1)


def hostnames(nodelist: str) -> List[str]:
    return subprocess.run(
        ["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True, check=True
    ).stdout.split()


def sacct_fields(job_id: str, keys: str) -> Dict[str, str]:
    """The job's own sacct record (-X), polled: accounting lags the controller by a second or two."""
    found: Dict[str, str] = {}

    def complete() -> bool:
        out = subprocess.run(
            ["sacct", "-n", "-X", "-P", "-j", job_id, "-o", keys], capture_output=True, text=True
        ).stdout
        rows = [line.split("|") for line in out.splitlines() if line]
        if rows:
            found.update(zip(keys.split(","), rows[-1]))
        return bool(rows) and found.get("State") == "COMPLETED" and found.get("Partition") not in ("", None)

    poll(complete, 30, f"sacct's record of job {job_id}")
    return found


def rank_hosts(run_dir: Path) -> Dict[int, str]:
    hosts = {}
    for log in (run_dir / "logs").glob("rank*.log"):
        match = re.search(r"rank (\d+)/(\d+) \(local \d+, started by srun\) on host (\S+),", log.read_text())
        hosts[int(match.group(1))] = match.group(3)
    return hosts


def test_the_cluster_has_16_nodes_in_two_name_ranges(slurm_cluster_16):
    out = subprocess.run(["sinfo", "-h", "-o", "%P|%D|%N"], capture_output=True, text=True, check=True).stdout
    partitions = {p.rstrip("*"): (int(n), nodes) for p, n, nodes in (line.split("|") for line in out.split())}
    for name in ("debug", "gpu_p2", "short"):
        assert partitions[name] == (SCALE_NODES, SCALE_NODELIST)
    for name, nodes in SCALE_PARTITIONS.items():
        assert partitions[name] == (SCALE_NODES // 2, nodes)
    assert hostnames(SCALE_NODELIST) == expand_hostlist(SCALE_NODELIST)
    assert expand_hostlist(SCALE_NODELIST)[7:9] == ["gpu-a8", "hpcnode01"]


# -- a. ddp over 16 nodes computes what one process computes -------------------------------------
def test_ddp_on_16_nodes_ends_with_the_single_process_loss(slurm_cluster_16, tmp_path):
    train = [*TRAIN, "trainer.max_steps=6", "trainer.batch_size=32"]  # the same global batch: 2 samples per rank
    single = tmp_path / "single"
    assert_ok(run_cli([*train, "strategy=single"], single))
    run_dir = tmp_path / "ddp16"
    proc = run_cli(
        [
            *SLURM,
            *train,
            "strategy=ddp",
            f"resources.nodes={SCALE_NODES}",
            "resources.gpus_per_node=1",
            "launcher.wait=true",
        ],
        run_dir,
        timeout=420,
    )
    assert_ok(proc)
    job = _job_id(proc.stdout)

    summary = read_summary(run_dir)
    assert summary["world_size"] == SCALE_NODES and summary["global_batch"] == 32 and summary["global_step"] == 6
    assert summary["train_loss"] == pytest.approx(read_summary(single)["train_loss"], abs=1e-5)
    # Slurm's own record: 16 nodes, one task on each, the host list spanning both name prefixes.
    fields = wait_for_job_end(job)
    assert fields["JobState"] == "COMPLETED"
    assert (fields["NumNodes"], fields["NumTasks"], tres_gpus(fields)) == (
        str(SCALE_NODES),
        str(SCALE_NODES),
        SCALE_NODES,
    )
    assert fields["NodeList"] == SCALE_NODELIST
    accounted = sacct_fields(job, "JobID,State,Partition,NNodes,NodeList,AllocTRES")
    assert accounted["NNodes"] == str(SCALE_NODES) and accounted["NodeList"] == SCALE_NODELIST
    assert f"gres/gpu={SCALE_NODES}" in accounted["AllocTRES"]
    # Every rank ran on a node of its own, rank 0 (the rendezvous) on the first of the list.
    hosts = rank_hosts(run_dir)
    assert sorted(hosts) == list(range(SCALE_NODES))
    assert sorted(hosts.values()) == sorted(expand_hostlist(SCALE_NODELIST))
    assert hosts[0] == first_host(fields["NodeList"]) == "gpu-a1"


# -- b. what the dry run prints is what Slurm gets, for 16-node layouts ----------------------------
# overrides -> (nodes, tasks per node, GPUs per node, CPUs per task, partition)
LAYOUTS = {
    "hybrid-16x2": (
        [
            "strategy=hybrid",
            "resources.nodes=16",
            "resources.gpus_per_node=4",
            "strategy.stages=2",
            "strategy.chunks=2",
            "cluster.partition=gpu_p2",
        ],
        (16, 2, 4, 2, "gpu_p2"),
    ),
    "pipelining-16x2": (
        [
            "strategy=pipeline",
            "strategy.engine=pipelining",
            "resources.nodes=16",
            "resources.gpus_per_node=2",
            "strategy.chunks=2",
        ],
        (16, 2, 2, 1, "debug"),
    ),
    "pipelining-8x2-gpu_a": (
        [
            "strategy=pipeline",
            "strategy.engine=pipelining",
            "resources.nodes=8",
            "resources.gpus_per_node=2",
            "strategy.chunks=2",
            "cluster.partition=gpu_a",
        ],
        (8, 2, 2, 1, "gpu_a"),
    ),
}


@pytest.mark.parametrize("row", list(LAYOUTS))
def test_16_node_dry_run_is_what_slurm_got(row, slurm_cluster_16, tmp_path):
    overrides, (nodes, tasks_per_node, gpus_per_node, cpus_per_task, partition) = LAYOUTS[row]
    args = [*SLURM, *TRAIN, "trainer.max_steps=4", "trainer.batch_size=64", *overrides, "+cluster.extra.hold=true"]
    run_dir = tmp_path / "run"
    dry = run_cli([*args, "dry_run=true"], run_dir)
    assert_ok(dry)
    script = dry.stdout.split("\nhpc-train (dry run")[0].strip()
    assert script.startswith("#!/bin/bash") and f"#SBATCH --nodes={nodes}\n" in script
    proc = run_cli(args, run_dir)  # held (sbatch --hold): queued, never started
    assert_ok(proc)
    job = _job_id(proc.stdout)
    try:
        got = subprocess.run(
            ["scontrol", "write", "batch_script", job, "-"], capture_output=True, text=True, check=True
        ).stdout
        assert got.strip() == script
        fields = scontrol_job(job)
        assert (fields["JobState"], fields["Reason"]) == ("PENDING", "JobHeldUser")
        assert fields["NumNodes"].split("-")[0] == str(nodes)
        assert fields["NumTasks"] == str(nodes * tasks_per_node) and fields["CPUs/Task"] == str(cpus_per_task)
        assert fields["NtasksPerN:B:S:C"].startswith(f"{tasks_per_node}:")
        assert fields["TresPerNode"] == f"gres:gpu:{gpus_per_node}" and tres_gpus(fields) == nodes * gpus_per_node
        assert fields["Partition"] == partition and fields["Requeue"] == "1"
    finally:
        subprocess.run(["scancel", job], check=False)
    poll(lambda: job not in squeue_ids(), 30, f"job {job} to leave the queue")


def test_a_job_larger_than_a_name_range_partition_is_refused(slurm_cluster_16, tmp_path):
    before = set(squeue_ids())
    proc = run_cli(
        [
            *SLURM,
            *TRAIN,
            "trainer.max_steps=4",
            "trainer.batch_size=72",
            "strategy=ddp",
            "resources.nodes=9",
            "resources.gpus_per_node=1",
            "cluster.partition=hpc",
        ],
        tmp_path / "run",
    )
    assert proc.returncode == 2 and "partition hpc has 8" in proc.stderr, proc.stderr
    assert set(squeue_ids()) == before


# -- c. a node of a 15-node job fails: requeued onto the 15 nodes left, resumed -------------------
REQUEUE_NODES = SCALE_NODES - 1  # one node spare, so the requeued job fits on the 15 still up
RESUME_15 = [
    *TRAIN,
    "trainer.max_steps=12",
    "trainer.batch_size=60",  # 4 samples per rank
    "trainer.checkpoint_every=3",
    "trainer.keep_checkpoints=3",
    "strategy=ddp",
]


@pytest.fixture(scope="module")
def local_reference_15(tmp_path_factory):
    """The same 15-rank ddp run, uninterrupted, on this machine (launcher=local)."""
    run_dir = tmp_path_factory.mktemp("reference-ddp15")
    assert_ok(run_cli([*RESUME_15, f"resources.gpus_per_node={REQUEUE_NODES}"], run_dir, timeout=420))
    return run_dir


@pytest.fixture(scope="module")
def node_failure_run(slurm_cluster_16, tmp_path_factory):
    """A 15-node ddp job on the 16-node cluster; one of its nodes is declared down mid-job.

    Slurm ends the job as NODE_FAIL and requeues it; the failed node stays out (drained), so the
    job starts again on the 14 nodes left of its own plus the spare one. Returns the run dir,
    the job's final scontrol fields, the failed node, the spare and both attempts' nodes.
    """
    run_dir = tmp_path_factory.mktemp("node-failure") / "run"
    args = [*SLURM, *RESUME_15, f"resources.nodes={REQUEUE_NODES}", "resources.gpus_per_node=1"]
    proc = run_cli(args, run_dir, env=dict(os.environ, HPC_TRAIN_STEP_SLEEP="1.0"))
    assert_ok(proc)
    job = _job_id(proc.stdout)
    node, finished = None, False
    try:
        wait_for(lambda: checkpoint_steps(run_dir) != [], 300, "the first checkpoint")
        first_nodes = hostnames(scontrol_job(job)["NodeList"])
        assert len(first_nodes) == REQUEUE_NODES
        spare = sorted(set(expand_hostlist(SCALE_NODELIST)) - set(first_nodes))
        assert len(spare) == 1
        node = first_nodes[-1]  # the last rank's node; rank 0 (and the rendezvous) sit on the first
        assert scontrol_job(job)["JobState"] == "RUNNING", "the job ended before its node could fail: slow it down"
        # Drained first: with ReturnToService=2 a node merely set down is back as soon as its slurmd
        # registers again, and the requeued job could land on it.
        subprocess.run(
            ["scontrol", "update", f"nodename={node}", "state=drain", "reason=hpc-train test: node failure next"],
            check=True,
        )
        subprocess.run(
            ["scontrol", "update", f"nodename={node}", "state=down", "reason=hpc-train test: node failure"], check=True
        )
        poll(lambda: scontrol_job(job).get("Restarts") == "1", 60, "Slurm to requeue the job")
        poll(
            lambda: scontrol_job(job).get("JobState") == "RUNNING",
            180,
            "the requeued job to start without the failed node",
        )
        second_nodes = hostnames(scontrol_job(job)["NodeList"])
        fields = wait_until_finished_with_summary(job, run_dir, timeout=400)
        finished = True
    finally:
        if node is not None:
            restore_node(node)
        if not finished:
            subprocess.run(["scancel", job], check=False)
    return {
        "run_dir": run_dir,
        "job": job,
        "fields": fields,
        "node": node,
        "spare": spare[0],
        "first": first_nodes,
        "second": second_nodes,
    }


@pytest.mark.timeout(1200)
def test_node_failure_requeues_onto_the_remaining_nodes_and_resumes(node_failure_run, local_reference_15):
    """Like test_requeue_slurm's 2-node case, on 15 of the 16 nodes, without waiting for the failed node."""
    run = node_failure_run
    run_dir, node = run["run_dir"], run["node"]
    assert node not in run["second"] and run["spare"] in run["second"]
    assert sorted(run["second"]) == sorted(set(run["first"]) - {node} | {run["spare"]})
    assert run["fields"]["Restarts"] == "1"
    summary = read_summary(run_dir)
    assert summary["attempts"] == 2 and summary["world_size"] == REQUEUE_NODES and summary["global_step"] == 12
    assert 3 <= summary["resumed_from_step"] < 12
    records = [json.loads(line) for line in (run_dir / "attempts.jsonl").read_text().splitlines()]
    said = [r for r in records if r["event"] == "end" and r.get("source") == "slurm"]
    assert [(r["attempt"], r["how"]) for r in said] == [(1, "node failure (Slurm: NODE_FAIL)")]
    assert attempt_endings(run_dir)[-1] == (2, "finish")
    assert summary["train_loss"] == pytest.approx(read_summary(local_reference_15)["train_loss"], abs=1e-6)
    # The weights agree to the last bit but for a few float rounding steps (see the next test).
    resumed, reference = final_weights(run_dir), final_weights(local_reference_15)
    assert resumed.keys() == reference.keys()
    for name in reference:
        assert torch.allclose(resumed[name], reference[name], rtol=0, atol=1e-6), name


def test_node_failure_resume_is_bit_identical(node_failure_run, local_reference_15):
    assert_bit_identical(local_reference_15, node_failure_run["run_dir"])
