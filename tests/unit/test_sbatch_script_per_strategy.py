"""sbatch/ holds one plain sbatch script per strategy."""

from __future__ import annotations

from tests.support.paths import REPO

SCRIPTS = sorted(p.stem for p in (REPO / "sbatch").glob("*.slurm"))


def test_every_strategy_has_a_script():
    assert set(SCRIPTS) == {"single", "dp", "ddp", "model_parallel", "pipeline", "hybrid"}
