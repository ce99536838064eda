"""Your own training script on the Slurm test cluster: sweeps over its learning rate and layouts, requeued by scontrol
or by the requeue signal, resuming from its checkpoint."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Tuple

import pytest

from tests.e2e.test_scripts import (
    OBJECTIVE,
    PROJECT,
    SCRIPT,
    SHOW_ENV,
    STALE_SHELL,
    TORCHRUN_KEYS,
    hpc_train,
    script_envs,
)
from tests.support.cli import assert_ok, read_summary, run_cli
from tests.support.slurm import scontrol_job

RESUME = ["script.resume_args=['--init_from=resume']", "script.resume_if=${hydra:runtime.output_dir}/out/ckpt.pt"]


SLURM = ["launcher=slurm", "cluster.cpus_per_gpu=1", "cluster.time=5", "strategy=single", "resources.gpus_per_node=1"]


# The sweep's job 0 and two single jobs, each interrupted once the script wrote its first ckpt.pt (then it is worth
# interrupting): the sweep's and the scontrol one's by `scontrol requeue`, the signal one's by Slurm's USR2 before
# the time limit (sent by hand).
SWEEP = [
    "-m", *SLURM, "launcher.wait=true", OBJECTIVE, *RESUME, "+script.overrides.learning_rate=0.001,0.1",
]  # fmt: skip
SWEEP_SCRIPT = [*SCRIPT, "--max_iters=20", "--eval_interval=5", "--step_sleep=0.3"]
ONE_JOB_SCRIPT = [*SCRIPT, "--max_iters=30", "--eval_interval=5", "--step_sleep=0.3"]
ONE_JOB = {
    "scontrol": [*SLURM, *RESUME, *ONE_JOB_SCRIPT],
    "signal": [*SLURM, "launcher.signal_delay_s=30", "script.resume_args=['--init_from=resume']", *ONE_JOB_SCRIPT],
}
INTERRUPT = {
    "sweep": lambda job: ["scontrol", "requeue", job],
    "scontrol": lambda job: ["scontrol", "requeue", job],
    "signal": lambda job: ["scancel", "--signal=USR2", job],
}


@dataclass
class Interrupted:
    sweep: Path  # the sweep's dir
    first: List[str]  # the sweep's job 0's row of jobs.tsv (its Slurm id first)
    cli: subprocess.Popen  # the sweep's hpc-train -m (launcher.wait=true)
    out: str  # what it printed
    jobs: Dict[str, Tuple[str, Path]]  # the single jobs by ONE_JOB's name: (Slurm id, run dir)


@pytest.fixture(scope="module")
def interrupted(slurm_cluster, tmp_path_factory) -> Interrupted:
    """The sweep and the two single jobs side by side (one requeue's time, not three), each interrupted once its
    first checkpoint is there; the sweep followed to its end by launcher.wait, the single jobs to COMPLETED."""
    folder = tmp_path_factory.mktemp("interrupted")
    sweep = folder / "sweep"
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
    command = [sys.executable, "-m", "hpc_train.cli", *SWEEP, f"hydra.sweep.dir={sweep}", *SWEEP_SCRIPT]
    cli = subprocess.Popen(command, cwd=PROJECT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        jobs = {name: (submitted(args, folder / name), folder / name) for name, args in ONE_JOB.items()}
        waiting = {"sweep": (sweep / "0", None), **{name: (run_dir, job) for name, (job, run_dir) in jobs.items()}}
        deadline = time.monotonic() + 180
        while waiting:
            for name, (run_dir, job) in list(waiting.items()):
                assert cli.poll() is None or name != "sweep", "the sweep's first job wrote no checkpoint"
                assert time.monotonic() < deadline, f"{name}: no checkpoint yet ({job and scontrol_job(job)})"
                if (run_dir / "out" / "ckpt.pt").exists():
                    if name == "sweep":
                        first = (sweep / "jobs.tsv").read_text().splitlines()[1].split("\t")
                        job = first[0]
                    subprocess.run(INTERRUPT[name](job), check=True)
                    del waiting[name]
            time.sleep(0.3)
        out, _ = cli.communicate(timeout=400)
    finally:
        if cli.poll() is None:
            cli.kill()
    for job, run_dir in jobs.values():
        wait_for_completion(job, run_dir)
    return Interrupted(sweep, first, cli, out, jobs)


def submitted(args: List[str], run_dir: Path) -> str:
    """The script job submitted (hpc-train returns once it is queued); its Slurm id."""
    proc = hpc_train(args, run_dir)
    assert_ok(proc)
    return re.search(r"submitted Slurm job (\d+)", proc.stdout).group(1)


def wait_for_completion(job: str, run_dir: Path) -> None:
    """Until the (requeued) job is COMPLETED with a summary; a job that failed or was cancelled fails the test."""
    deadline = time.monotonic() + 300
    while not ((run_dir / "summary.json").exists() and scontrol_job(job).get("JobState") == "COMPLETED"):
        state = scontrol_job(job).get("JobState")
        assert state not in ("FAILED", "CANCELLED", "TIMEOUT") and time.monotonic() < deadline, state
        time.sleep(1)


@pytest.mark.slurm
def test_a_two_job_slurm_sweep_over_the_scripts_learning_rate_one_job_requeued(interrupted):
    """strategy=single on Slurm: no torchrun variable reaches the nanoGPT-shaped script (it would start NCCL and
    fail). One job of the sweep is requeued after its first checkpoint and resumes from it."""
    sweep, first, cli, out = interrupted.sweep, interrupted.first, interrupted.cli, interrupted.out
    assert first[1] == "0"
    assert cli.returncode == 0, out
    # the printed end of job 0 is its last attempt's (the first one's result file said it failed)
    assert f"hpc-train: job {first[0]} was requeued by Slurm (attempt 2)" in out and "failed" not in out, out
    assert out.strip().splitlines()[-1].startswith("hpc-train: sweep of 2 job(s) ended: 2 completed"), out
    rows = [line.split("\t") for line in (sweep / "jobs.tsv").read_text().splitlines()[1:]]
    assert len(rows) == 2
    for row in rows:
        summary = read_summary(sweep / row[1])
        assert summary["attempts"] == (2 if row[1] == "0" else 1) and summary["eval_loss"] > 0, (row, summary)
        assert (sweep / row[1] / "out" / "ckpt.pt").is_file(), "each job's ${hydra:runtime.output_dir} is its own"
    outs = [(sweep / "slurm" / f"{row[0]}_0_log.out").read_text() for row in rows]  # the array's task logs
    learning_rates = [re.search(r"config: learning_rate=([0-9.]+) max_iters=20", o).group(1) for o in outs]
    assert sorted(learning_rates) == ["0.001", "0.1"]
    resumed = int(re.search(r"resuming from iter (\d+)", outs[0]).group(1))
    assert 5 <= resumed < 20 and resumed % 5 == 0 and "iter 20: loss" in outs[0]
    assert "resuming" not in outs[1] and read_summary(sweep / "0")["script"][-1] == "--init_from=resume"


@pytest.mark.slurm
def test_a_slurm_sweep_gives_each_layout_its_environment(slurm_cluster, tmp_path):
    """dp (one task, two GPUs) and ddp (two tasks, a GPU each) as one sweep: the dp script sees Slurm's variables
    and both GPUs, no torchrun variable; each ddp rank sees torchrun's, for its rank, and the node's two GPUs.
    The login shell's stale torchrun variables reach neither."""
    sweep = tmp_path / "sweep"
    args = ["-m", *SLURM[:-2], "launcher.wait=true", "strategy=dp,ddp", "resources.gpus_per_node=2"]
    proc = run_cli(
        [*args, f"hydra.sweep.dir={sweep}", *SHOW_ENV],
        None,
        cwd=PROJECT,
        timeout=600,
        env=dict(os.environ, **STALE_SHELL),
    )
    assert_ok(proc)
    [dp] = script_envs(sweep / "0")
    assert not TORCHRUN_KEYS & set(dp) and not [key for key in dp if key.startswith("TORCHELASTIC_")], dp
    assert dp["SLURM_NTASKS"] == "1" and len(dp["CUDA_VISIBLE_DEVICES"].split(",")) == 2, "the node's two GPUs"
    assert dp["HPC_TRAIN_RUN_DIR"] == str(sweep / "0") and dp["MY_OWN_SETTING"] == "kept"
    ddp = sorted(script_envs(sweep / "1"), key=lambda env: env["RANK"])
    assert [env["RANK"] for env in ddp] == ["0", "1"] and [env["SLURM_PROCID"] for env in ddp] == ["0", "1"]
    for env in ddp:
        assert env["LOCAL_RANK"] == env["SLURM_LOCALID"] and env["WORLD_SIZE"] == env["LOCAL_WORLD_SIZE"] == "2"
        assert env["GROUP_RANK"] == env["NODE_RANK"] == "0" and env["MASTER_ADDR"] == env["SLURMD_NODENAME"]
        assert env["MASTER_PORT"] != STALE_SHELL["MASTER_PORT"]
        assert env["CUDA_VISIBLE_DEVICES"] == ddp[0]["CUDA_VISIBLE_DEVICES"], "the node's GPUs, as under torchrun"
    assert len(ddp[0]["CUDA_VISIBLE_DEVICES"].split(",")) == 2, "each rank picks cuda:LOCAL_RANK of the job's two"


@pytest.mark.slurm
def test_scontrol_requeue_resumes_the_script_from_its_checkpoint(interrupted):
    job, run_dir = interrupted.jobs["scontrol"]
    fields = scontrol_job(job)
    assert fields["Restarts"] == "1"
    summary = read_summary(run_dir)
    assert summary["attempts"] == 2 and summary["script"][-1] == "--init_from=resume"
    out = next((run_dir / "slurm").glob(f"{job}_0_log.out")).read_text()
    resumed = int(re.search(r"resuming from iter (\d+)", out).group(1))
    assert 5 <= resumed < 30 and resumed % 5 == 0
    assert "iter 30: loss" in out
    starts = [json.loads(line) for line in (run_dir / "attempts.jsonl").read_text().splitlines()]
    assert [r["attempt"] for r in starts if r["event"] == "start"] == [1, 2]


@pytest.mark.slurm
def test_the_requeue_signal_requeues_a_script_that_does_not_handle_it(interrupted):
    """Slurm's USR2 before the time limit (sent by hand here) reaches every process of the job: the script ignores
    it (an unhandled USR2 would kill it), hpc_train requeues the job, the next attempt resumes."""
    job, run_dir = interrupted.jobs["signal"]
    assert scontrol_job(job)["Restarts"] == "1"
    records = [json.loads(line) for line in (run_dir / "attempts.jsonl").read_text().splitlines()]
    assert [(r["attempt"], r["how"]) for r in records if r["event"] == "end"] == [(1, "timeout"), (2, "finish")]
    out = (run_dir / "slurm" / f"{job}_0_log.out").read_text()
    assert re.search(r"resuming from iter ([1-9]\d*)", out) and "iter 30: loss" in out
    assert "received SIGUSR2: stopping the script" in (run_dir / "slurm" / f"{job}_0_log.err").read_text()
