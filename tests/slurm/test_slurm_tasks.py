"""Fewer tasks than --ntasks-per-node x nodes, on the Slurm test cluster.

`sbatch --nodes=2 --ntasks=3` makes Slurm run 2 tasks on one node and 1 on the other; `srun -n3`
inside a `--nodes=2 --ntasks-per-node=2` allocation does the same while SLURM_NTASKS_PER_NODE
still says 2. hpc_train reads the step's real layout (hpc_train/compute/runtime/ranks.py): a job spec
planned for 4 ranks is refused at start naming the plan and the step's layout, one planned for
3 ranks runs with world 3 and each rank's real local rank and local world size. The repository's
own sbatch scripts refuse such an allocation already in their batch step.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Dict, List

import pytest

from tests.support.cli import TINY, assert_ok, read_summary, run_cli
from tests.support.paths import REPO
from tests.support.slurm import wait_for_job_end

# A global batch of 24 splits over 3 ranks, over 4, and over the 8 of sbatch/ddp.slurm.
TRAIN = [*TINY, "trainer.max_steps=4", "trainer.epochs=null", "trainer.batch_size=24", "cluster.cpus_per_gpu=1"]
WORKER = f"{sys.executable} -u -m hpc_train.compute.worker"
ALLOCATIONS = {  # job -> (sbatch options, the srun line's options, ranks the job spec plans)
    "ntasks3_planned4": (["--nodes=2", "--ntasks=3"], "", 4),
    "srun3_planned4": (["--nodes=2", "--ntasks-per-node=2"], "-n3", 4),
    "ntasks3_planned3": (["--nodes=2", "--ntasks=3"], "", 3),
}
# What a 4-rank job spec says to a 3-task step, with the step's layout as Slurm chose it.
REFUSAL = re.compile(
    r"this job was planned for 4 rank\(s\), but this srun step runs 3 task\(s\) \((\d) on (hpcnode\d), (\d) on"
    r" (hpcnode\d)\); this process is rank \d of 3\. Fix: run the step with 4 tasks: srun -n 4"
)


def job_spec(run_dir: Path, planned: int) -> Path:
    """The job spec as `launcher=sbatch` writes it, here on the login side (no allocation to check)."""
    layout = (
        ["resources.nodes=2", "resources.gpus_per_node=2"]
        if planned == 4
        else ["resources.nodes=1", "resources.gpus_per_node=3"]
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_") or k == "SLURM_CONF"}
    assert_ok(run_cli(["launcher=sbatch", "strategy=ddp", *layout, *TRAIN], run_dir, env=env))
    return run_dir / "job_config.yaml"


def sbatch(workdir: Path, options: List[str], script: List[str], env: Dict[str, str] = None) -> str:
    command = [
        "sbatch",
        "--parsable",
        "--cpus-per-task=1",
        "--time=10",
        f"--chdir={workdir}",
        "--output=job-%j.out",
        *options,
        *script,
    ]
    proc = subprocess.run(command, capture_output=True, text=True, cwd=workdir, timeout=60, env=env)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip().split(";")[0]


@pytest.fixture(scope="module")
def jobs(slurm_cluster, tmp_path_factory):
    """Every job submitted at once; waits for all. name -> (run dir, job output, scontrol fields)."""
    root = tmp_path_factory.mktemp("tasks")
    submitted = {}
    for name, (options, srun, planned) in ALLOCATIONS.items():
        spec = job_spec(root / name, planned)
        line = f"export SRUN_CPUS_PER_TASK=1; srun {srun} --kill-on-bad-exit=1 {WORKER} {spec}"
        submitted[name] = sbatch(root, options, ["--wrap", line])
    # The repository's own script with the layout overridden on sbatch's command line.
    env = dict(os.environ, PYTHON=sys.executable, RUN_DIR=str(root / "ddp_script_ntasks3"))
    script = [str(REPO / "sbatch" / "ddp.slurm"), *TRAIN]
    submitted["ddp_script_ntasks3"] = sbatch(root, ["--nodes=2", "--ntasks=3"], script, env)
    ended = {}
    for name, job_id in submitted.items():
        fields = wait_for_job_end(job_id, timeout=240)
        ended[name] = (root / name, (root / f"job-{job_id}.out").read_text(), fields)
    return ended


@pytest.mark.slurm
@pytest.mark.parametrize("name", ["ntasks3_planned4", "srun3_planned4"])
def test_a_three_task_step_of_a_four_rank_job_is_refused_naming_its_layout(jobs, name):
    run_dir, output, fields = jobs[name]
    assert fields["JobState"] == "FAILED", output
    found = REFUSAL.search(output)
    assert found, output
    counts, hosts = sorted([int(found.group(1)), int(found.group(3))]), {found.group(2), found.group(4)}
    assert counts == [1, 2] and len(hosts) == 2, found.group(0)
    assert (
        "Refusal" not in output and "compute/runtime/entry.py" not in output
    )  # one message, no traceback of the refusal
    # The refusing ranks wrote it to their own logs too; none reached training.
    logs = [p.read_text() for p in sorted((run_dir / "logs").glob("rank*.log"))]
    assert any(REFUSAL.search(log) for log in logs), logs
    assert not (run_dir / "summary.json").exists() and not any("training toy_mlp" in log for log in logs)


@pytest.mark.slurm
def test_a_three_rank_job_runs_with_world_three_on_an_uneven_step(jobs):
    run_dir, output, fields = jobs["ntasks3_planned3"]
    assert fields["JobState"] == "COMPLETED", output
    summary = read_summary(run_dir)
    assert summary["world_size"] == 3 and summary["global_step"] == 4
    ranks = {}  # rank -> (host, local rank, local world size), each read back from the rank's log
    for rank_log in sorted((run_dir / "logs").glob("rank*.log")):
        text = rank_log.read_text()
        who = re.search(r"rank (\d)/3 \(local (\d), started by srun\) on host (\S+),", text)
        layout = re.search(
            r"spreads its 3 tasks unevenly \((.+?)\): local rank (\d) of the (\d) task\(s\) on this node", text
        )
        assert who and layout, text
        assert layout.group(2) == who.group(2)
        ranks[int(who.group(1))] = (who.group(3), int(who.group(2)), int(layout.group(3)))
    assert sorted(ranks) == [0, 1, 2]
    by_host: Dict[str, List] = {}
    for host, local, local_world in ranks.values():
        by_host.setdefault(host, []).append((local, local_world))
    assert sorted(len(v) for v in by_host.values()) == [1, 2]  # 2 tasks on one node, 1 on the other
    for host, tasks in by_host.items():  # local ranks 0..n-1 on a node of n tasks, each knowing n
        assert sorted(tasks) == [(local, len(tasks)) for local in range(len(tasks))], (host, tasks)


@pytest.mark.slurm
def test_the_repositorys_sbatch_script_refuses_three_tasks_in_its_batch_step(jobs):
    run_dir, output, fields = jobs["ddp_script_ntasks3"]
    assert fields["JobState"] == "FAILED", output
    assert "the allocation has 3 task(s), but the overrides plan 8 ranks" in output and "Fix:" in output
    assert "Traceback" not in output
    assert not (run_dir / "job_config.yaml").exists()  # no rank started
