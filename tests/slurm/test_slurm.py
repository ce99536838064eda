"""Submission to the real local Slurm cluster (munge + slurmdbd + slurmctld + 2 slurmd in network namespaces).

Each job trains a tiny model on CPU with gloo; the layout is read back from `scontrol show job -d`.
"""

import re
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Dict, Tuple

import pytest

from tests.support.cli import TINY, assert_ok, read_summary, run_cli
from tests.support.slurm import scontrol_job, squeue_ids, tres_gpus, wait_for_job_end

pytestmark = pytest.mark.slurm

SLURM = ["launcher=slurm", "cluster.cpus_per_gpu=1", "cluster.time=5", "launcher.signal_delay_s=30"]
TRAIN = [*TINY, "trainer.max_steps=6", "trainer.epochs=null", "trainer.batch_size=32"]


def _job_id(stdout: str) -> str:
    return re.search(r"submitted Slurm job (\d+)", stdout).group(1)


def _rank_lines(run_dir: Path):
    """(rank, world, local rank, source, host) for each rank log."""
    found = []
    for log in sorted((run_dir / "logs").glob("rank*.log")):
        m = re.search(r"rank (\d+)/(\d+) \(local (\d+), started by ([^)]+)\) on host (\S+),", log.read_text())
        found.append((int(m.group(1)), int(m.group(2)), int(m.group(3)), m.group(4), m.group(5)))
    return sorted(found)


def assert_job_layout(run_dir: Path, job_id: str, nodes: int, tasks_per_node: int, gpus_per_node: int) -> None:
    """The ended job ran as laid out: Slurm's nodes, tasks and GPUs, every rank with its Slurm identity on its host,
    and rank 0 alone wrote the summary of all the steps."""
    fields = wait_for_job_end(job_id)
    assert fields["JobState"] == "COMPLETED", fields
    world = nodes * tasks_per_node
    assert int(fields["NumNodes"]) == nodes and int(fields["NumTasks"]) == world, fields
    assert tres_gpus(fields) == nodes * gpus_per_node
    assert f"gpu:{gpus_per_node}" in fields.get("TresPerNode", ""), fields
    ranks = _rank_lines(run_dir)
    assert [r[0] for r in ranks] == list(range(world))
    assert all(r[1] == world and r[3] == "srun" for r in ranks)
    assert sorted(r[2] for r in ranks) == sorted(list(range(tasks_per_node)) * nodes)
    assert len({r[4] for r in ranks}) == nodes  # ranks really ran on `nodes` different hosts
    summary = read_summary(run_dir)
    assert summary["world_size"] == world and summary["global_step"] == 6
    assert len(list(run_dir.glob("summary.json"))) == 1


# strategy overrides -> (nodes, tasks per node, GPUs per node, GPUs per task): the Slurm shapes no other test here
# submits (one task of 2 GPUs; tasks of one GPU and of 2 GPUs over 2 nodes). One task per GPU on 1 and on 2 nodes are
# the jobs of test_sweep_gives_each_job_its_own_layout and test_dry_run_is_the_submitted_script; every strategy's
# layout row is tests/unit/test_layout.py's.
ROWS = {
    "pipeline": (["strategy=pipeline", "resources.gpus_per_node=2", "strategy.chunks=2"], (1, 1, 2, 2)),
    "pipelining-2x2": (
        [
            "strategy=pipeline",
            "strategy.engine=pipelining",
            "resources.nodes=2",
            "resources.gpus_per_node=2",
            "strategy.chunks=2",
        ],
        (2, 2, 2, 1),
    ),
    "hybrid-2x2x2": (
        ["strategy=hybrid", "resources.nodes=2", "resources.gpus_per_node=4", "strategy.stages=2"],
        (2, 2, 4, 2),
    ),
}


@pytest.fixture(scope="module")
def laid_out(slurm_cluster, tmp_path_factory) -> Dict[str, Tuple[Path, subprocess.CompletedProcess]]:
    """ROWS' jobs submitted side by side (together they fit on the cluster: 2 + 4 + 8 of its 16 GPUs), each followed
    to its end by launcher.wait; (run dir, the command) by row."""
    folder = tmp_path_factory.mktemp("layouts")
    with ThreadPoolExecutor(len(ROWS)) as pool:
        runs = {
            row: pool.submit(run_cli, [*SLURM, *TRAIN, *overrides, "launcher.wait=true"], folder / row)
            for row, (overrides, _) in ROWS.items()
        }
    return {row: (folder / row, run.result()) for row, run in runs.items()}


@pytest.mark.parametrize("row", list(ROWS))
def test_job_layout_matches_strategy(row, laid_out):
    _, (nodes, tasks_per_node, gpus_per_node, gpus_per_task) = ROWS[row]
    run_dir, proc = laid_out[row]
    assert_ok(proc)
    job_id = _job_id(proc.stdout)
    assert_job_layout(run_dir, job_id, nodes, tasks_per_node, gpus_per_node)
    # the script Slurm got says the same layout
    submitted = (run_dir / "slurm" / f"{job_id}_submission.sh").read_text().splitlines()
    for expected in (
        f"--nodes={nodes}",
        f"--ntasks-per-node={tasks_per_node}",
        f"--gres=gpu:{gpus_per_node}",
        f"--cpus-per-task={gpus_per_task}",
    ):
        assert f"#SBATCH {expected}" in submitted, (expected, submitted)


def test_dry_run_is_the_submitted_script(slurm_cluster, tmp_path):
    run_dir = tmp_path / "run"
    overrides = [
        *SLURM,
        *TRAIN,
        "strategy=ddp",
        "resources.nodes=2",
        "resources.gpus_per_node=2",
        "cluster.partition=gpu_p2",
        "cluster.setup=['echo setup-line-ran']",
    ]
    before = set(squeue_ids())
    dry = run_cli([*overrides, "dry_run=true"], run_dir)
    assert_ok(dry)
    sbatch_lines = [line for line in dry.stdout.splitlines() if line.startswith("#SBATCH")]
    for expected in (
        "--nodes=2",
        "--ntasks-per-node=2",
        "--gres=gpu:2",
        "--cpus-per-task=1",
        "--partition=gpu_p2",
        "--time=5",
        "--signal=B:USR2@30",
    ):
        assert f"#SBATCH {expected}" in sbatch_lines
    assert "dry run, nothing submitted" in dry.stdout
    assert "echo setup-line-ran" in dry.stdout.splitlines()
    assert set(squeue_ids()) == before  # nothing queued by a dry run
    assert not (run_dir / "slurm").exists()
    proc = run_cli([*overrides, "launcher.wait=true"], run_dir)
    assert_ok(proc)
    job_id = _job_id(proc.stdout)
    submitted = (run_dir / "slurm" / f"{job_id}_submission.sh").read_text()
    assert [line for line in submitted.splitlines() if line.startswith("#SBATCH")] == sbatch_lines
    assert submitted in dry.stdout  # the whole script hpc_train rendered is the one submitit wrote: setup, srun line
    assert scontrol_job(job_id)["Partition"] == "gpu_p2"
    assert_job_layout(run_dir, job_id, nodes=2, tasks_per_node=2, gpus_per_node=2)
    assert "setup-line-ran" in (run_dir / "slurm" / f"{job_id}_0_log.out").read_text()


def test_gpus_per_node_flag(slurm_cluster, tmp_path):
    proc = run_cli(
        [
            *SLURM,
            *TRAIN,
            "strategy=ddp",
            "resources.gpus_per_node=2",
            "cluster.gpu_flag=gpus-per-node",
            "launcher.wait=true",
        ],
        tmp_path / "run",
    )
    assert_ok(proc)
    fields = wait_for_job_end(_job_id(proc.stdout))
    assert fields["JobState"] == "COMPLETED" and tres_gpus(fields) == 2


def test_sweep_gives_each_job_its_own_layout(slurm_cluster, tmp_path):
    sweep_dir = tmp_path / "sweep"
    proc = run_cli(
        [
            "-m",
            *SLURM,
            *TRAIN,
            "strategy=single,ddp",
            "resources.gpus_per_node=1,2",
            "launcher.wait=true",
            f"hydra.sweep.dir={sweep_dir}",
        ]
    )
    assert_ok(proc)
    table = [line.split("\t") for line in (sweep_dir / "jobs.tsv").read_text().splitlines()[1:]]
    assert len(table) == 4
    expected = {("single", 1): (1, 1), ("single", 2): (1, 1), ("ddp", 1): (1, 1), ("ddp", 2): (2, 2)}  # tasks, GPUs
    array_ids = {}
    for job_id, subdir, overrides, _layout in table:
        strategy = re.search(r"strategy=(\w+)", overrides).group(1)
        gpus = int(re.search(r"resources.gpus_per_node=(\d+)", overrides).group(1))
        fields = wait_for_job_end(job_id)
        assert fields["JobState"] == "COMPLETED", fields
        tasks, gres = expected[(strategy, gpus)]
        assert_job_layout(sweep_dir / subdir, job_id, nodes=1, tasks_per_node=tasks, gpus_per_node=gres)
        assert read_summary(sweep_dir / subdir)["strategy"] == strategy
        array_ids.setdefault((strategy, gpus if strategy != "single" else 1, tasks), set()).add(
            fields.get("ArrayJobId")
        )
    # The two `single` jobs share a layout: one job array; the others are jobs of their own.
    single_arrays = array_ids[("single", 1, 1)]
    assert len(single_arrays) == 1 and None not in single_arrays


@pytest.mark.parametrize(
    "overrides, key",
    [
        (["strategy=single", "resources.nodes=2"], "resources.nodes"),
        (["strategy=ddp", "resources.gpus_per_node=3", "trainer.batch_size=32"], "trainer.batch_size"),
        (["cluster.partition=no_such_partition"], "cluster.partition"),
        (["cluster.time=0"], "cluster.time"),
        (["job_name='a;rm -rf /'"], "job_name"),
        (["job_name='two\nlines'"], "job_name"),
        (["cluster.setup=['module load x; echo owned']"], "cluster.setup[0]"),
        (["cluster.setup=['echo $(id)']"], "cluster.setup[0]"),
        (["cluster.setup=['conda activate \"my env']"], "cluster.setup[0]"),
    ],
)
def test_bad_layouts_are_refused_before_queueing(overrides, key, slurm_cluster, tmp_path):
    before = set(squeue_ids())
    proc = run_cli([*SLURM, *TRAIN, *overrides], tmp_path / "run")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert f"`{key}`" in proc.stderr and "Fix:" in proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr
    assert set(squeue_ids()) <= before, "a job was queued"  # (a job queued before may end meanwhile)
    assert not (tmp_path / "run" / "slurm").exists()


def test_bad_sweep_job_submits_nothing(slurm_cluster, tmp_path):
    before = set(squeue_ids())
    sweep_dir = tmp_path / "sweep"
    proc = run_cli(["-m", *SLURM, *TRAIN, "strategy=ddp,single", "resources.nodes=2", f"hydra.sweep.dir={sweep_dir}"])
    assert proc.returncode == 2
    assert "nothing was submitted" in proc.stderr
    assert set(squeue_ids()) <= before, "a job was queued"  # (a job queued before may end meanwhile)
    assert not (sweep_dir / "jobs.tsv").exists()


def test_sweep_with_a_mistyped_key_submits_nothing(slurm_cluster, tmp_path):
    before = set(squeue_ids())
    proc = run_cli(
        ["-m", *SLURM, *TRAIN, "strategy=ddp,single", "trainer.batchsize=3", f"hydra.sweep.dir={tmp_path / 'sweep'}"]
    )
    assert proc.returncode != 0
    assert "trainer.batchsize" in proc.stderr
    assert set(squeue_ids()) <= before, "a job was queued"  # (a job queued before may end meanwhile)


def test_sweep_dry_run_lays_out_every_job(slurm_cluster, tmp_path):
    proc = run_cli(
        [
            "-m",
            *SLURM,
            *TRAIN,
            "dry_run=true",
            "strategy=single,ddp",
            "resources.gpus_per_node=1,2",
            "seed=range(0,5)",
            f"hydra.sweep.dir={tmp_path / 'sweep'}",
        ]
    )
    assert_ok(proc)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("#")]
    assert len(lines) == 20
    assert sum("ddp: 1 node x 2 tasks/node" in line for line in lines) == 5
    assert sum("seed=4" in line for line in lines) == 4  # values set on shared compositions really differ per job


def test_a_partition_the_cluster_lacks_is_said_before_the_memory_check_runs(slurm_cluster, tmp_path):
    """Slurm's own checks come first: a job refused for its partition is told so at once, without waiting for its
    memory estimate (this one would not fit its declared GPU either: its floor alone is 3 GB)."""
    big = ["model.hidden=65536", "data.image_size=32", "cluster.gpu_memory_gb=2"]
    proc = run_cli([*SLURM, *TRAIN, *big, "cluster.partition=no_such_partition"], tmp_path / "run")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "`cluster.partition`" in proc.stderr and "memory check" not in proc.stdout + proc.stderr
    fits_not = run_cli([*SLURM, *TRAIN, *big], tmp_path / "run")  # the same job on a partition that exists
    assert fits_not.returncode == 2 and "the job will not fit" in fits_not.stderr, fits_not.stdout + fits_not.stderr
