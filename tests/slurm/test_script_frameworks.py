"""Framework scripts as they are: a Hugging Face `Trainer` script and a Lightning script under hpc-train.

The scripts (tests/support/scripts/hf_train.py, tests/support/scripts/lightning_train.py) use the real packages and
know nothing of hpc_train's layout: each rank writes what it saw, which the tests read.

Lightning under Slurm: hpc_train forwards `script.signal=SIGUSR1` to every rank; Lightning's SLURM
handler saves `hpc_ckpt_1.ckpt` and runs `scontrol requeue` itself, so the job is already ending
when hpc_train's grace runs: hpc_train records the attempt and does not requeue a second time.
The requeued job's Lightning restores the checkpoint by itself (it looks for `hpc_ckpt_*.ckpt` in
`default_root_dir` when it runs under Slurm).
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Dict, List

import pytest

from tests.e2e.test_script_frameworks_locally import DDP, HF_SCRIPT, check_hf_run, hpc_train
from tests.slurm.test_requeue_slurm import attempt_endings, wait_until_finished_with_summary
from tests.support.cli import assert_ok, read_summary, wait_for
from tests.support.slurm import scontrol_job

LIGHTNING = "tests/support/scripts/lightning_train.py"
SLURM = ["launcher=slurm", "cluster.cpus_per_gpu=1", "cluster.time=5", "launcher.signal_delay_s=30"]


@pytest.mark.slurm
def test_hf_trainer_script_as_a_two_node_slurm_ddp_job(slurm_cluster, tmp_path):
    run_dir = tmp_path / "run"
    args = [
        "launcher=slurm",
        "cluster.cpus_per_gpu=1",
        "cluster.time=5",
        "launcher.wait=true",
        "strategy=ddp",
        "resources.nodes=2",
        "resources.gpus_per_node=1",
    ]
    proc = hpc_train(args, run_dir, HF_SCRIPT)
    assert_ok(proc)
    ranks = check_hf_run(run_dir, per_node=1)
    job = re.search(r"submitted Slurm job (\d+)", proc.stdout).group(1)
    hosts = subprocess.run(
        ["scontrol", "show", "hostnames", scontrol_job(job)["NodeList"]], capture_output=True, text=True, check=True
    ).stdout.split()
    assert len(hosts) == 2 and ranks[0]["env"]["MASTER_ADDR"] == ranks[1]["env"]["MASTER_ADDR"] == hosts[0]


def lightning_events(run_dir: Path, rank: int) -> List[Dict]:
    return [json.loads(line) for line in (run_dir / "lightning" / f"rank{rank}.jsonl").read_text().splitlines()]


@pytest.mark.slurm
def test_lightning_script_checkpoints_on_sigusr1_is_requeued_once_and_resumes(slurm_cluster, tmp_path):
    import torch

    run_dir = tmp_path / "run"
    epochs, steps_per_epoch = 2, 64 // (4 * 2)  # 64 samples, 4 per device, 2 ranks: 16 steps
    script = [LIGHTNING, "--root_dir=${hydra:runtime.output_dir}/lightning", f"--epochs={epochs}", "--step_sleep=0.4"]
    proc = hpc_train([*SLURM, *DDP, "script.signal=SIGUSR1", "script.signal_grace_s=30"], run_dir, script)
    assert_ok(proc)
    job = re.search(r"submitted Slurm job (\d+)", proc.stdout).group(1)
    metrics = run_dir / "metrics.jsonl"
    wait_for(lambda: metrics.exists() and len(metrics.read_text().splitlines()) >= 4, 180, "4 training steps")
    subprocess.run(
        ["scancel", "--signal=USR2", job], check=True
    )  # what Slurm sends launcher.signal_delay_s before the time limit

    fields = wait_until_finished_with_summary(job, run_dir, timeout=240)
    assert fields["Restarts"] == "1", "requeued once: by Lightning's handler, not a second time by hpc_train"
    task0 = (run_dir / "slurm" / f"{job}_0_log.err").read_text()
    assert "Handling auto-requeue signal: 10" in task0 and f"Requeued SLURM job: {job}" in task0
    assert "CalledProcessError" not in task0, "hpc_train must not requeue the job Lightning requeued"
    assert attempt_endings(run_dir) == [(1, "timeout"), (2, "finish")]

    total = epochs * steps_per_epoch
    checkpoint = run_dir / "lightning" / "hpc_ckpt_1.ckpt"
    saved_at = torch.load(checkpoint, map_location="cpu", weights_only=False)["global_step"]
    assert 4 <= saved_at < total
    for rank in (0, 1):
        first, resumed, end = lightning_events(run_dir, rank)
        # Lightning found its ranks in Slurm's variables, and they are hpc_train's.
        for event in (first, resumed):
            assert event["cluster_environment"] == "SLURMEnvironment"
            assert event["global_rank"] == event["local_rank"] == rank and event["world_size"] == 2
            assert (
                event["env"]["SLURM_PROCID"] == event["env"]["RANK"] == str(rank)
                and event["env"]["SLURM_NTASKS"] == "2"
            )
        assert (first["attempt"], first["global_step"], first["ckpt_path"]) == ("1", 0, None)
        assert (resumed["attempt"], resumed["ckpt_path"], resumed["global_step"]) == ("2", str(checkpoint), saved_at)
        assert (end["attempt"], end["global_step"], end["epoch"]) == ("2", total, epochs)
        assert resumed["env"]["SLURM_RESTART_COUNT"] == "1"
    assert lightning_events(run_dir, 0)[-1]["checksum"] == lightning_events(run_dir, 1)[-1]["checksum"]
    summary = read_summary(run_dir)
    assert summary["attempts"] == 2 and summary["global_step"] == total
    steps = [json.loads(line)["step"] for line in metrics.read_text().splitlines()]
    assert steps[-(total - saved_at) :] == list(range(saved_at + 1, total + 1)), (
        "attempt 2 went on from the checkpoint's step"
    )
