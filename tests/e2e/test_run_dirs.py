"""Run dirs: a dry run and a refused command leave none behind; a command never shares one with another by accident.

Every command runs in a temporary working directory, so Hydra's default ``outputs/<date>/<time>`` lands there.
A run dir named by the clock is what two commands started in the same second share; here the clock's pattern is
the year (``hydra.run.dir=out/${now:%Y}``), so "the same second" holds for commands run one after the other.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from tests.support.cli import TINY, run_cli

NO_SLURM = {**os.environ, "PATH": str(Path(sys.executable).parent)}  # a laptop: no sinfo, no sbatch
ONE_STEP = [*TINY, "strategy=single", "trainer.batch_size=16", "trainer.max_steps=1", "trainer.epochs=1"]
BY_YEAR = "hydra.run.dir=out/${now:%Y}"


def test_a_dry_run_and_a_refused_command_leave_no_run_dir(tmp_path):
    dry = run_cli(["launcher=slurm", "strategy=ddp", "dry_run=true"], cwd=tmp_path, env=NO_SLURM)
    assert dry.returncode == 0 and "#SBATCH" in dry.stdout, dry.stdout + dry.stderr
    assert "outputs/" in dry.stdout  # the script names the run dir it would have had
    refused = run_cli(["strategy=ddp", "trainer.lr=-1"], cwd=tmp_path, env=NO_SLURM)
    assert refused.returncode == 2 and "`trainer.lr`" in refused.stderr, refused.stdout + refused.stderr
    assert list(tmp_path.iterdir()) == [], list(tmp_path.rglob("*"))


def test_commands_started_in_the_same_second_get_distinct_run_dirs(tmp_path):
    year = time.strftime("%Y")
    first = run_cli([*ONE_STEP, BY_YEAR], cwd=tmp_path, env=NO_SLURM)
    assert first.returncode == 0, first.stdout + first.stderr
    taken = tmp_path / "out" / year
    before = files_of(taken)
    assert Path("summary.json") in before and Path(".hydra/config.yaml") in before
    # A command refused into the finished run's dir leaves every file of that run as it was (.hydra/, cli.log).
    refused = run_cli([*ONE_STEP, "trainer.lr=-1", f"hydra.run.dir={taken}"], cwd=tmp_path, env=NO_SLURM)
    assert refused.returncode == 2 and "`trainer.lr`" in refused.stderr, refused.stdout + refused.stderr
    assert files_of(taken) == before
    dry = run_cli(["launcher=slurm", "strategy=single", "dry_run=true", BY_YEAR], cwd=tmp_path, env=NO_SLURM)
    assert dry.returncode == 0 and f"out/{year}-1/slurm/" in dry.stdout, dry.stdout + dry.stderr
    assert not (tmp_path / "out" / f"{year}-1").exists()  # the dry run's own dir is gone again
    second = run_cli([*ONE_STEP, "trainer.lr=0.05", BY_YEAR], cwd=tmp_path, env=NO_SLURM)
    assert second.returncode == 0 and f"out/{year}-1/summary.json" in second.stdout, second.stdout + second.stderr
    assert files_of(taken) == before  # untouched
    overrides = (tmp_path / "out" / f"{year}-1" / ".hydra" / "overrides.yaml").read_text()
    assert "trainer.lr=0.05" in overrides


def files_of(run_dir: Path) -> dict:
    """Every file of a run dir: its bytes and its modification time."""
    return {p.relative_to(run_dir): (p.read_bytes(), p.stat().st_mtime_ns) for p in run_dir.rglob("*") if p.is_file()}
