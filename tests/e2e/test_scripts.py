"""Your own training script: `hpc-train [overrides] -- train.py ARGS`, locally (on the Slurm test cluster:
tests/slurm/test_scripts_on_slurm.py).

The script is tests/support/scripts/nanogpt_like/train.py: nanoGPT's shape (configurator-style `--key=value`,
data opened relative to its working directory, `ckpt.pt` and `--init_from=resume`, DDP with NCCL on
`cuda:{LOCAL_RANK}` whenever `RANK` is set), unaware of hpc_train and Slurm: it trains on the CPU only if
its one-process layout gives it no torchrun variable. tests/support/scripts/show_env.py writes the environment
it was given, read back key by key.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path
from typing import List

import pytest

from tests.support.cli import assert_ok, read_summary, run_cli
from tests.support.paths import SCRIPTS

PROJECT = SCRIPTS / "nanogpt_like"
OUT = "--out_dir=${hydra:runtime.output_dir}/out"  # each run (each sweep job) its own out dir
SCRIPT = ["--", "train.py", "--device=cpu", OUT]
SHOW_ENV = ["--", "../show_env.py"]
OBJECTIVE = "script.objective_regex='val loss ([0-9.]+)'"
# What torchrun sets (less its agent's TORCHELASTIC_*): none of it reaches a one-process layout's script.
TORCHRUN_KEYS = {
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "GROUP_WORLD_SIZE",
    "NODE_RANK",
    "ROLE_RANK",
    "ROLE_NAME",
    "ROLE_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
}
# A login shell left over from a torchrun or an interactive allocation: none of it may reach the script.
STALE_SHELL = dict(
    RANK="7",
    LOCAL_RANK="3",
    WORLD_SIZE="9",
    LOCAL_WORLD_SIZE="9",
    GROUP_RANK="5",
    NODE_RANK="5",
    MASTER_ADDR="nowhere",
    MASTER_PORT="1",
    TORCHELASTIC_ERROR_FILE="/nowhere/error.json",
    MY_OWN_SETTING="kept",
)


def hpc_train(args: List[str], run_dir: Path, **kwargs) -> subprocess.CompletedProcess:
    """hpc-train with the run dir set before `--` (everything after it is the script's)."""
    split = args.index("--") if "--" in args else len(args)
    return run_cli([*args[:split], f"hydra.run.dir={run_dir}", *args[split:]], None, cwd=PROJECT, **kwargs)


def script_envs(run_dir: Path) -> List[dict]:
    """The environments tests/support/scripts/show_env.py was started with, one per process, by host and pid."""
    return [json.loads(path.read_text()) for path in sorted((run_dir / "env").glob("*.json"))]


def test_each_layout_gives_the_script_what_python_or_torchrun_would(tmp_path):
    """single, dp, model_parallel and pipeline run the script as `python script.py` runs it: no torchrun variable,
    not even one the login shell had; a one-rank ddp gets torchrun's, for rank 0 of 1."""
    shell = dict(os.environ, **STALE_SHELL)
    one_process = ["strategy=single", "strategy=dp", "strategy=model_parallel", "strategy=pipeline"]
    for index, strategy in enumerate([*one_process, "strategy=ddp"]):
        run_dir = tmp_path / str(index)
        gpus = "1" if strategy in ("strategy=single", "strategy=ddp") else "2"
        assert_ok(hpc_train([strategy, f"resources.gpus_per_node={gpus}", *SHOW_ENV], run_dir, env=shell))
        [env] = script_envs(run_dir)
        assert env["HPC_TRAIN_RUN_DIR"] == str(run_dir) and env["HPC_TRAIN_ATTEMPT"] == "1", strategy
        assert env["OMP_NUM_THREADS"] == str(os.cpu_count()) and env["MY_OWN_SETTING"] == "kept", strategy
        assert env["CUDA_VISIBLE_DEVICES"] == "", "left as it was (the tests hide GPUs)"
        assert not [key for key in env if key.startswith(("TORCHELASTIC_", "HPC_TRAIN_LOCAL", "HPC_TRAIN_LAUNCH"))]
        given = {key: env[key] for key in TORCHRUN_KEYS & set(env)}
        if strategy in one_process:
            assert given == {}, f"{strategy}: torchrun's variables reached a one-process script: {given}"
        else:
            port = given.pop("MASTER_PORT")
            assert port.isdigit() and port != STALE_SHELL["MASTER_PORT"]
            assert given == dict(
                RANK="0",
                LOCAL_RANK="0",
                WORLD_SIZE="1",
                LOCAL_WORLD_SIZE="1",
                GROUP_RANK="0",
                GROUP_WORLD_SIZE="1",
                NODE_RANK="0",
                ROLE_RANK="0",
                ROLE_NAME="default",
                ROLE_WORLD_SIZE="1",
                MASTER_ADDR="127.0.0.1",
            )


def test_a_nanogpt_shaped_script_with_its_ddp_switch_trains_on_the_cpu_under_single(tmp_path):
    """The script starts DDP with NCCL on cuda:LOCAL_RANK whenever RANK is set: under strategy=single it must not
    be, so --device=cpu holds, as with `python train.py --device=cpu`. Under a one-rank ddp (torchrun's variables)
    the same command fails as it fails under torchrun: the switch is live."""
    run_dir = tmp_path / "run"
    proc = hpc_train(["strategy=single", *SCRIPT, "--max_iters=3"], run_dir, env=dict(os.environ, **STALE_SHELL))
    assert_ok(proc)
    assert "iter 3: loss" in proc.stdout and read_summary(run_dir)["attempts"] == 1
    ddp = hpc_train(["strategy=ddp", "resources.gpus_per_node=1", *SCRIPT, "--max_iters=3"], tmp_path / "ddp")
    assert ddp.returncode != 0 and "iter 1: loss" not in ddp.stdout
    assert re.search(r"NCCL|CUDA|GPU", ddp.stdout + ddp.stderr), ddp.stderr[-2000:]


def test_a_nanogpt_shaped_script_runs_in_its_own_folder(tmp_path):
    run_dir = tmp_path / "run"
    proc = hpc_train(["strategy=single", OBJECTIVE, *SCRIPT, "--max_iters=12"], run_dir)
    assert_ok(proc)
    assert "config: learning_rate=0.01 max_iters=12 init_from='scratch'" in proc.stdout
    assert (run_dir / "out" / "ckpt.pt").is_file(), "the interpolated --out_dir is the run dir's"
    summary = read_summary(run_dir)
    assert summary["script"] == ["train.py", "--device=cpu", f"--out_dir={run_dir}/out", "--max_iters=12"]
    assert summary["eval_loss"] == float(re.search(r"val loss ([0-9.]+)", proc.stdout).group(1))
    spec = (run_dir / "job_config.yaml").read_text()
    assert f"cwd: {PROJECT}" in spec and f"--out_dir={run_dir}/out" in spec


def test_sweep_overrides_reach_the_script_typed_as_python_writes_them(tmp_path):
    sweep = tmp_path / "sweep"
    args = ["-m", "strategy=single", "+script.overrides.learning_rate=0.001,0.1", "+script.overrides.max_iters=3"]
    proc = run_cli([*args, f"hydra.sweep.dir={sweep}", *SCRIPT], None, cwd=PROJECT)
    assert_ok(proc)
    logs = [(sweep / job / "logs" / "rank0.log").read_text() for job in ("0", "1")]
    assert "--learning_rate=0.001 --max_iters=3" in logs[0] and "--learning_rate=0.1 --max_iters=3" in logs[1]
    for job in ("0", "1"):
        assert (sweep / job / "out" / "ckpt.pt").is_file()


def test_optuna_optimises_what_the_script_prints(tmp_path):
    sweep = tmp_path / "sweep"
    args = [
        "-m",
        "hydra/sweeper=optuna",
        "hydra.sweeper.sampler.seed=1",
        "hydra.sweeper.n_trials=2",
        f"hydra.sweep.dir={sweep}",
        "strategy=single",
        OBJECTIVE,
        "+script.overrides.max_iters=4",
        "+script.overrides.learning_rate=interval(0.001,0.1)",
        *SCRIPT,
    ]
    assert_ok(run_cli(args, None, cwd=PROJECT, timeout=600))
    losses = [read_summary(path.parent)["eval_loss"] for path in sorted(sweep.glob("*/summary.json"))]
    assert len(losses) == 2
    import yaml

    results = yaml.safe_load((sweep / "optimization_results.yaml").read_text())
    assert results["best_value"] == pytest.approx(min(losses), rel=1e-9)
    assert 0.001 <= results["best_params"]["+script.overrides.learning_rate"] <= 0.1
