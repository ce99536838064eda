"""A Hugging Face Trainer script as it is, under hpc-train on this machine: two ddp ranks over gloo."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Dict, List

from tests.support.cli import assert_ok, read_summary, run_cli

HF = "tests/support/scripts/hf_train.py"

DDP = ["strategy=ddp", "resources.gpus_per_node=2"]


def hpc_train(args: List[str], run_dir: Path, script: List[str], timeout: float = 300) -> subprocess.CompletedProcess:
    """`hpc-train ARGS hydra.run.dir=RUN_DIR -- SCRIPT...` (the run dir before `--`: after it, it is the script's)."""
    return run_cli([*args, f"hydra.run.dir={run_dir}", "--", *script], timeout=timeout)


HF_SAMPLES, HF_PER_DEVICE = 32, 4

HF_SCRIPT = [
    HF,
    "--output_dir=${hydra:runtime.output_dir}/hf",
    f"--samples={HF_SAMPLES}",
    f"--batch_size={HF_PER_DEVICE}",
]


def check_hf_run(run_dir: Path, per_node: int) -> List[Dict]:
    """Two ranks of one Trainer run over gloo DDP, each on its half of the data, ending with the same weights."""
    ranks = [json.loads((run_dir / "hf" / f"rank{r}.json").read_text()) for r in (0, 1)]
    for rank, record in enumerate(ranks):
        env = record["env"]
        assert (env["RANK"], env["WORLD_SIZE"], env["LOCAL_WORLD_SIZE"]) == (str(rank), "2", str(per_node))
        assert (env["LOCAL_RANK"], env["NODE_RANK"]) == (str(rank % per_node), str(rank // per_node))
        assert env["HPC_TRAIN_RUN_DIR"] == str(run_dir) and env["HPC_TRAIN_ATTEMPT"] == "1"
        assert record["process_index"] == rank
        assert record["args_world_size"] == record["dist_world_size"] == 2
        assert record["dist_backend"] == "gloo" and record["parallel_mode"] == "ParallelMode.DISTRIBUTED"
        assert record["wrapped"] == "DistributedDataParallel"
    assert (
        ranks[0]["env"]["MASTER_ADDR"] == ranks[1]["env"]["MASTER_ADDR"]
        and ranks[0]["env"]["MASTER_PORT"] == ranks[1]["env"]["MASTER_PORT"]
    )
    # Each rank trained on its own half of the data, yet both end with the same weights: the gradients were all-reduced.
    seen = [set(record["samples_seen"]) for record in ranks]
    assert not seen[0] & seen[1] and seen[0] | seen[1] == set(range(HF_SAMPLES))
    assert ranks[0]["checksum"] == ranks[1]["checksum"] != ranks[0]["initial_checksum"]
    # One epoch of 32 samples at 4 per device is 4 optimizer steps with 2 ranks (8 alone).
    steps = HF_SAMPLES // (HF_PER_DEVICE * 2)
    assert ranks[0]["global_step"] == ranks[1]["global_step"] == steps
    state = json.loads((run_dir / "hf" / "trainer_state.json").read_text())
    assert state["global_step"] == state["max_steps"] == steps and state["train_batch_size"] == HF_PER_DEVICE
    summary = read_summary(run_dir)
    assert summary["world_size"] == 2 and summary["attempts"] == 1
    assert summary["global_step"] == steps, "the script's log_metrics rows (rank 0's only) reach summary.json"
    assert summary["train_loss"] == [row for row in state["log_history"] if "loss" in row][-1]["loss"]
    assert [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()] == list(
        range(1, steps + 1)
    )
    return ranks


def test_hf_trainer_script_trains_as_two_ddp_ranks_over_gloo(tmp_path):
    run_dir = tmp_path / "run"
    assert_ok(hpc_train(DDP, run_dir, HF_SCRIPT))
    ranks = check_hf_run(run_dir, per_node=2)
    assert ranks[0]["env"]["MASTER_ADDR"] == "127.0.0.1"
