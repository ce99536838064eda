"""The public Python API's calls that start no job: compose (with a user's config dir), staged_model, and a sweep over
launchers refused."""

from __future__ import annotations

import pytest

import hpc_train
from tests.support.cli import TINY


@pytest.fixture(autouse=True)
def cpu_here(monkeypatch, tmp_path):
    """CPU workers (as run_cli gives the CLI), and default run dirs under the test's own dir."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    monkeypatch.chdir(tmp_path)


JOB = [*TINY, "strategy=single", "trainer.max_steps=4", "trainer.epochs=null"]


def test_compose_with_a_users_config_dir(tmp_path):
    conf = tmp_path / "my_conf"
    (conf / "cluster").mkdir(parents=True)
    (conf / "cluster" / "mysite.yaml").write_text(
        "defaults:\n  - slurm\n  - _self_\n\nname: mysite\npartition: gpu_p2\ngpus_per_node: 8\n"
    )
    cfg = hpc_train.compose(["launcher=slurm", "cluster=mysite"], config_dir=conf)
    shipped = hpc_train.compose(["launcher=slurm"])
    assert cfg.cluster.name == "mysite" and cfg.cluster.partition == "gpu_p2" and cfg.cluster.gpus_per_node == 8
    assert cfg.cluster.cpus_per_gpu == shipped.cluster.cpus_per_gpu  # inherited from the shipped profile
    with pytest.raises(hpc_train.ConfigError, match="did you mean 'mysite'"):
        hpc_train.compose(["launcher=slurm", "cluster=mysit"], config_dir=conf)


def test_a_sweep_over_launchers_is_refused():
    with pytest.raises(hpc_train.ConfigError, match="mixes launchers"):
        hpc_train.sweep([*JOB, "launcher=local,slurm"])


def test_staged_model_is_the_strategies_split():
    torch = pytest.importorskip("torch")
    from hydra.utils import instantiate

    model = instantiate(hpc_train.compose(["model=toy_mlp", "data=synthetic", "data.image_size=8"]).model)
    staged = hpc_train.staged_model(model, ["cpu"], stages=2, chunks=2)
    assert len(staged.stages) == 2 and staged.devices == [torch.device("cpu")] * 2
    x = torch.randn(4, 3, 8, 8)
    torch.testing.assert_close(
        staged(x), model(x), rtol=1e-5, atol=1e-6
    )  # micro-batches: other BLAS blockings, rounding only
    assert len(hpc_train.staged_model(model, split_points=["2"]).stages) == 2  # named modules, any model
