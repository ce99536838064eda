"""A job stopped before its end says how it goes on in the words of where it ran: a run, the same command; a sweep's
job on Slurm (arrays or packed runs), hpc-train-report --rerun-failed; a local sweep's job, the sweep's command into
its sweep dir. The job spec records which (job.sweep, from Hydra's mode and the launcher); every hint reads it."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import pytest
from hydra.core.global_hydra import GlobalHydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode

from hpc_train.launch.hydra.cli_child import hydra_initialized
from hpc_train.launch.planning.jobspec import hydra_sweep, write_yaml
from hpc_train.records import rundir


@pytest.fixture
def hydra_mode():
    """Set HydraConfig to the shipped config composed in a mode, as `hpc-train` (`-m` or not) leaves it for a job
    (Hydra adds hydra.mode=MULTIRUN or RUN to the overrides)."""
    from hydra.core.utils import setup_globals

    setup_globals()
    before = HydraConfig.instance().cfg

    def compose(mode: RunMode, *overrides: str) -> None:
        loader = GlobalHydra.instance().hydra.config_loader  # type: ignore[union-attr]
        overrides = (*overrides, f"hydra.mode={mode.name}")
        HydraConfig.instance().set_config(loader.load_configuration("config", list(overrides), run_mode=mode))

    with hydra_initialized(None):
        yield compose
    HydraConfig.instance().cfg = before


@pytest.mark.parametrize("launcher, rerun", [("slurm", rundir.RERUN_FAILED), ("local", rundir.RERUN_SWEEP)])
def test_a_sweeps_job_records_its_sweep_dir_and_how_its_jobs_run_again(hydra_mode, tmp_path, launcher, rerun):
    hydra_mode(RunMode.MULTIRUN, f"launcher={launcher}", "hydra.sweep.dir=sweep")
    assert hydra_sweep(launcher) == {"dir": str(Path("sweep").resolve()), "rerun": rerun}


def test_a_run_records_no_sweep(hydra_mode, tmp_path):
    hydra_mode(RunMode.RUN, f"hydra.run.dir={tmp_path}", "hydra.sweep.dir=sweep")
    assert hydra_sweep("local") is None and hydra_sweep("slurm") is None


def run_dir_of(tmp_path: Path, sweep: Optional[dict]) -> Path:
    run_dir = tmp_path / "sweep" / "1"
    run_dir.mkdir(parents=True)
    write_yaml({"job": {"run_dir": str(run_dir), "sweep": sweep}}, run_dir / rundir.JOB_CONFIG)
    return run_dir


HINTS = {
    None: "run the same command again (same hydra.run.dir={run_dir}) to resume from the last checkpoint",
    rundir.RERUN_FAILED: "rerun the sweep's jobs that did not complete with: hpc-train-report {sweep}"
    " --rerun-failed (each resumes from its last checkpoint)",
    rundir.RERUN_SWEEP: "run the sweep's command again with hydra.sweep.dir={sweep} to resume its jobs from their last"
    " checkpoints (its finished jobs are left as they are)",
}


@pytest.mark.parametrize("rerun", list(HINTS), ids=["a run", "a Slurm sweep's job", "a local sweep's job"])
def test_every_closing_line_that_resumes_gives_the_hint_of_where_the_job_ran(tmp_path, rerun):
    sweep_dir = tmp_path / "sweep"
    run_dir = run_dir_of(tmp_path, None if rerun is None else {"dir": str(sweep_dir), "rerun": rerun})
    hint = HINTS[rerun].format(run_dir=run_dir, sweep=sweep_dir)
    assert rundir.resume_hint(run_dir) == hint
    for code in (rundir.EXIT_HUNG, rundir.EXIT_INTERRUPTED):
        assert rundir.closing_line(code, run_dir).endswith(f"; {hint}")
    assert "same command" not in rundir.closing_line(rundir.EXIT_FAILED, run_dir)
    others = [text for key, text in HINTS.items() if key != rerun]
    assert not any(other.split("{")[0] in rundir.closing_line(rundir.EXIT_HUNG, run_dir) for other in others)


def test_a_run_dir_without_a_job_spec_gets_a_runs_hint(tmp_path):
    assert rundir.resume_hint(tmp_path) == HINTS[None].format(run_dir=tmp_path)
