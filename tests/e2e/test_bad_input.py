"""A packed sweep that cannot be packed is refused before anything is queued, and its dry run prints each allocation:
both ask Slurm (sinfo) for the partition first, so the command runs in its own process. Every other refusal of bad
input: tests/unit/test_refused_input.py (the entry point called in-process).
"""

import pytest

from tests.support.cli import TINY, run_cli

PACKED = ["-m", "launcher=slurm", "dry_run=true", "launcher.pack.allocations=2", "launcher.pack.gpus_per_node=2"]


@pytest.mark.parametrize(
    "overrides, key, fix",
    [
        (
            ["strategy=ddp", "resources.gpus_per_node=4", "seed=1,2"],
            "launcher.pack.gpus_per_node",
            "launcher.pack.gpus_per_node=4",
        ),
        (
            ["strategy=ddp", "resources.nodes=2", "resources.gpus_per_node=1", "seed=1,2"],
            "launcher.pack.nodes",
            "launcher.pack.nodes=2",
        ),
        (["strategy=single", "cluster.partition=debug,gpu_p2"], "launcher.pack.allocations", "separate packed sweeps"),
        (
            ["strategy=single", "launcher.pack.time=abc", "seed=1,2"],
            "launcher.pack.time",
            "launcher.pack.time=04:00:00",
        ),
    ],
)
def test_a_packed_sweep_that_cannot_be_packed_is_refused_before_anything_is_queued(overrides, key, fix, tmp_path):
    sweep_dir = tmp_path / "sweep"
    proc = run_cli([*PACKED, *TINY, *overrides, f"hydra.sweep.dir={sweep_dir}"], None)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    message = proc.stderr.strip()
    assert f"`{key}`" in message and "Fix:" in message and fix in message, message
    assert "Traceback" not in proc.stdout + proc.stderr
    assert not (sweep_dir / ".hpc_train" / "pack").exists(), "nothing may be planned or queued"


def test_the_dry_run_of_a_packed_sweep_prints_each_allocations_script_and_its_runs(tmp_path):
    proc = run_cli([*PACKED, *TINY, "strategy=single", "seed=1,2,3", f"hydra.sweep.dir={tmp_path / 'sweep'}"], None)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    assert "# allocation 0: 1 node(s) x 2 GPUs" in out and "2 runs (#0, #2)" in out and "1 run (#1)" in out
    assert out.count("#SBATCH --gres=gpu:2") == 2 and out.count("#SBATCH --signal=B:USR2@") == 2
    assert "exec " in out and "-m hpc_train.pack.scheduler" in out
    assert not (tmp_path / "sweep" / ".hpc_train" / "pack").exists()
