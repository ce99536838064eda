"""Scripts of the user's own under hpc-train (`hpc-train [overrides] -- script.py ARGS`), with real processes.

tests/support/scripts/ddp_allreduce.py is a torchrun-style DDP script (gloo, ranks from the environment)
that writes each rank's environment and results to ``$HPC_TRAIN_RUN_DIR/rank<R>.json``. It runs
locally one process per rank and under torchrun (as a 2-node Slurm job both ways:
tests/slurm/test_scripts_dist_on_slurm.py). Every rank must end with the same all-reduced sum and the same weights
(equal to one
process stepping on the mean of every rank's loss), and carry torchrun's variables, consistent
across ranks. tests/support/scripts/hydra_app.py is a Hydra app swept by ``+script.overrides.lr=...``
with ``script.arg_style='{key}={value}'``. The refusals of a bad ``script.argv`` are in
tests/e2e/test_bad_input.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Dict, List

import pytest
from omegaconf import OmegaConf

from tests.support.cli import assert_ok, read_summary, run_cli
from tests.support.paths import REPO

DDP_SCRIPT = "tests/support/scripts/ddp_allreduce.py"
HYDRA_APP = "tests/support/scripts/hydra_app.py"
STEPS = 3


def hpc_train(args: List[str], run_dir: Path, script: List[str], timeout: float = 300) -> subprocess.CompletedProcess:
    """`hpc-train ARGS hydra.run.dir=RUN_DIR -- SCRIPT...` (the run dir before `--`: after it, it is the script's)."""
    proc = run_cli([*args, f"hydra.run.dir={run_dir}", "--", *script], timeout=timeout)
    assert_ok(proc)
    return proc


def rank_records(run_dir: Path, world: int) -> List[Dict]:
    records = [json.loads((run_dir / f"rank{rank}.json").read_text()) for rank in range(world)]
    assert [r["rank"] for r in records] == list(range(world)) and all(r["world_size"] == world for r in records)
    assert not (run_dir / f"rank{world}.json").exists(), "more ranks than the layout asks for"
    return records


def reference_weights(world: int, steps: int = STEPS) -> List[float]:
    """What DDP must give: one process stepping on the mean of every rank's loss (DDP averages gradients)."""
    import torch

    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    data = [torch.Generator().manual_seed(1000 + rank) for rank in range(world)]
    for _ in range(steps):
        batches = [torch.randn(8, 4, generator=g) for g in data]
        loss = sum((model(x) - x.sum(dim=1, keepdim=True)).pow(2).mean() for x in batches) / world
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return [float(v) for p in model.parameters() for v in p.detach().flatten()]


def check_ranks(records: List[Dict], run_dir: Path, world: int, per_node: int) -> None:
    """The same results on every rank, and torchrun's variables consistent across ranks."""
    assert all(r["all_reduce"] == [world * (world + 1) / 2, sum(10.0**k for k in range(world))] for r in records)
    weights = records[0]["weights"]
    assert all(r["weights"] == weights for r in records), "DDP keeps every rank's weights identical"
    assert weights == pytest.approx(reference_weights(world), abs=1e-6)
    envs = [r["env"] for r in records]
    assert [e["RANK"] for e in envs] == [str(rank) for rank in range(world)]
    assert {e["WORLD_SIZE"] for e in envs} == {str(world)}
    assert {e["LOCAL_WORLD_SIZE"] for e in envs} == {str(per_node)}
    for e in envs:
        group = int(e["GROUP_RANK"])
        assert int(e["RANK"]) == group * per_node + int(e["LOCAL_RANK"]), e
        assert 0 <= int(e["LOCAL_RANK"]) < per_node
    hosts_by_group: Dict[str, set] = {}
    for r, e in zip(records, envs):
        hosts_by_group.setdefault(e["GROUP_RANK"], set()).add(r["host"])
    assert sorted(hosts_by_group) == [str(g) for g in range(world // per_node)], hosts_by_group
    assert all(len(hosts) == 1 for hosts in hosts_by_group.values()), f"a node rank on two hosts: {hosts_by_group}"
    assert len({e["MASTER_ADDR"] for e in envs}) == 1 and len({e["MASTER_PORT"] for e in envs}) == 1, envs
    assert {e["HPC_TRAIN_ATTEMPT"] for e in envs} == {"1"}
    assert {e["HPC_TRAIN_RUN_DIR"] for e in envs} == {str(run_dir)}
    for r, e in zip(records, envs):
        assert e["OMP_NUM_THREADS"] == str(r["torch_threads"]) and int(e["OMP_NUM_THREADS"]) >= 1, (e, r)


# -- locally (launcher=local) -----------------------------------------------------------------------
def test_ddp_script_locally_one_process_per_rank(tmp_path):
    run_dir = tmp_path / "run"
    proc = hpc_train(["strategy=ddp", "resources.gpus_per_node=2"], run_dir, [DDP_SCRIPT, "--steps", str(STEPS)])
    records = rank_records(run_dir, 2)
    check_ranks(records, run_dir, world=2, per_node=2)
    assert all(r["env"]["NODE_RANK"] == "0" and r["env"]["TORCHELASTIC_RUN_ID"] is None for r in records)
    assert records[0]["env"]["MASTER_ADDR"] == "127.0.0.1"
    assert "finished (attempt 1)" in proc.stdout


def test_ddp_script_locally_under_torchrun(tmp_path):
    run_dir = tmp_path / "run"
    args = ["strategy=ddp", "resources.gpus_per_node=2", "script.launcher=torchrun"]
    proc = hpc_train(args, run_dir, [DDP_SCRIPT])
    records = rank_records(run_dir, 2)
    check_ranks(records, run_dir, world=2, per_node=2)
    assert len({r["env"]["TORCHELASTIC_RUN_ID"] for r in records}) == 1 and records[0]["env"]["TORCHELASTIC_RUN_ID"]
    assert "-m torch.distributed.run --nnodes 1 --nproc-per-node 2 --rdzv-backend c10d" in proc.stdout
    assert read_summary(run_dir)["world_size"] == 1  # one local task: the torchrun agent


# -- a Hydra app as the script, swept -----------------------------------------------------------------
def test_hydra_app_swept_with_key_equals_value_arguments(tmp_path):
    """A 2-job sweep over the app's lr: each job's app gets its own lr (a float, parsed by the app's Hydra)
    and its own run dir, from an interpolation in script.argv resolved per job."""
    sweep = tmp_path / "sweep"
    # The line a user types into bash: the quotes keep {key}={value} one Hydra string and ${...} unexpanded.
    line = (
        f"{sys.executable} -m hpc_train.cli -m strategy=single +script.overrides.lr=0.1,0.01"
        " +script.overrides.steps=3 +script.overrides.flag=False +script.overrides.name=abc"
        " '+script.overrides.dims=[4,2]' \"script.arg_style='{key}={value}'\""
        f" hydra.sweep.dir={sweep} -- {HYDRA_APP} 'hydra.run.dir=${{hydra:runtime.output_dir}}/app'"
    )
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
    proc = subprocess.run(["bash", "-c", line], capture_output=True, text=True, timeout=300, cwd=REPO, env=env)
    assert_ok(proc)
    job_dirs = sorted(
        p for p in sweep.iterdir() if p.is_dir() and not p.name.startswith(".")
    )  # .hpc_train: the launcher's own
    assert [p.name for p in job_dirs] == ["0", "1"], job_dirs
    lrs = []
    for job_dir in job_dirs:
        received = json.loads((job_dir / "received.json").read_text())
        config, types = received["config"], received["types"]
        lrs.append(config["lr"])
        assert types == {"lr": "float", "steps": "int", "flag": "bool", "name": "str", "dims": "list"}, types
        assert (config["steps"], config["flag"], config["name"], config["dims"]) == (3, False, "abc", [4, 2])
        assert received["app_output_dir"] == str(job_dir / "app") and (job_dir / "app" / ".hydra").is_dir()
        assert received["cwd"] == str(REPO), "the script runs where hpc-train was started"
        assert received["overrides"] == [f"lr={config['lr']}", "steps=3", "flag=False", "name=abc", "dims=[4, 2]"]
        job_config = (job_dir / "job_config.yaml").read_text()
        assert f"- hydra.run.dir={job_dir / 'app'}\n" in job_config, "script.argv resolved per job"
        assert OmegaConf.load(job_dir / "job_config.yaml").script.overrides.lr == config["lr"], "this job's own lr"
        assert read_summary(job_dir)["script"][:2] == [HYDRA_APP, f"hydra.run.dir={job_dir / 'app'}"]
    assert sorted(lrs) == [0.01, 0.1]
