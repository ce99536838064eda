"""The memory check before queueing (hpc_train.launch.planning.memory_check) with the real estimate in its own
process: a Llama-style job that will not fit its declared GPU is refused before anything is queued, with settings
that each pass the check when pasted; the dry run prints the estimate; a run's summary.json and hpc-train-report hold
the estimate beside the measured peak.

The GPU is declared tiny (cluster.gpu_memory_gb=1 of a v100: 0.93 GiB usable, less the Volta family's constants) so
that a small model, cheap to estimate on fake tensors, does not fit."""

from __future__ import annotations

import contextlib
import io
import json
import time
from pathlib import Path
from typing import List

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.hydra_config import HydraConfig
from omegaconf import open_dict

from hpc_train.conf import CONFIG_DIR
from hpc_train.launch.planning import fit_run, fit_specs, memory_check
from hpc_train.launch.planning.jobspec import build_job_spec
from hpc_train.launch.planning.plan import make_plan
from hpc_train.records import performance, rundir
from hpc_train.report import command as report
from tests.support.cli import TINY, run_cli
from tests.support.paths import REPO

PROJECT = REPO / "examples" / "llama_project"
# Activations (0.5 GiB for 16 sequences of 512) outweigh the parameters: one GPU does not hold them, half the batch
# or recomputed blocks do.
TOO_BIG = [
    f"hydra.searchpath=[file://{PROJECT / 'conf'}]",
    "model=llama_tiny",
    "model.dim=256",
    "model.n_layers=4",
    "model.hidden_dim=512",
    "data=herd_log",
    "data.seq_len=512",
    "trainer=llama",
    "trainer.batch_size=16",
    "strategy=single",
    "launcher=slurm",
    "cluster=slurm",
    "resources.gpus_per_node=2",
    "+cluster.gpu_type=v100",
    "cluster.gpu_memory_gb=1",
]


def _check(overrides: List[str], run_dir: Path):
    """The check as hpc-train runs it: in a Hydra that holds the job's config (its overrides composed again)."""
    held = HydraConfig.instance()
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        cfg = compose(config_name="config", overrides=overrides, return_hydra_config=True)
        held.set_config(cfg)
        try:
            with open_dict(cfg):
                del cfg["hydra"]
            plan = make_plan(cfg, run_dir)
            return memory_check.check(plan, build_job_spec(plan, choices={}))
        finally:
            held.cfg = None


def _counted(init, started: list):
    def counting(self, *args, **kwargs):
        started.append(self)
        init(self, *args, **kwargs)

    return counting


def test_a_job_that_will_not_fit_is_refused_with_settings_that_each_pass_the_check(tmp_path, monkeypatch):
    monkeypatch.chdir(PROJECT)  # the user's model is imported from where hpc-train starts, as on the ranks
    sessions = []
    monkeypatch.setattr(fit_run.Session, "__init__", _counted(fit_run.Session.__init__, sessions))
    started = time.perf_counter()
    with pytest.raises(memory_check.MemoryRefused) as refused:
        _check(TOO_BIG, tmp_path / "run")
    seconds = time.perf_counter() - started
    message = str(refused.value)
    assert "rank 0 needs 1.0 GiB of 947.2 MiB" in message and "activations 584.8 MiB" in message, message
    lines = message.split("Settings that fit (overrides to paste, the largest rank's need):\n")[1].splitlines()
    pasted = [line.strip().rsplit(": ", 1)[0].split() for line in lines if line.startswith("  ")]
    # the cheapest to estimate first (one rank, one micro-batch), until SUGGESTED fit: the others not estimated
    assert len(pasted) == memory_check.SUGGESTED and ["trainer.activation_checkpointing=blocks"] in pasted, message
    assert ["trainer.grad_accum_steps=2"] not in pasted and "2 more setting(s) not estimated once 3 fit" in message
    print(f"refused in {seconds:.1f} s with {len(pasted)} settings that fit")
    assert len(sessions) == 1  # the job's estimate and its settings': one process
    for overrides in pasted:  # each pasted after the user's overrides plans into the spec that was estimated
        with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
            [spec] = fit_specs.specs_for([overrides], tmp_path / "run", base=TOO_BIG)
        assert (memory_check.memory_key(spec), False) in memory_check._known, overrides
        fit = _check(fit_specs.merged(TOO_BIG, overrides), tmp_path / "run")
        assert fit is not None and fit.fits, overrides


def test_the_dry_run_prints_the_estimate_and_the_run_keeps_it_beside_the_measured_peak(tmp_path):
    run_dir = tmp_path / "run"
    job = [*TINY, "strategy=single", "trainer.max_steps=2", "trainer.eval=false", "cluster.gpu_memory_gb=1"]
    dry = run_cli([*job, "dry_run=true"], run_dir)
    assert dry.returncode == 0, dry.stdout + dry.stderr
    assert "hpc-train (dry run): memory: rank 0 needs" in dry.stdout, dry.stdout
    assert not (run_dir / rundir.MEMORY_ESTIMATE).exists()
    done = run_cli(job, run_dir)
    assert done.returncode == 0, done.stdout + done.stderr
    summary = json.loads((run_dir / rundir.SUMMARY).read_text())
    estimate = summary[performance.ESTIMATE]
    assert estimate["tensor_bytes"] > 0 and summary[performance.MEMORY] > 0
    assert estimate["estimate"]["ranks"][0]["rank"] == 0
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert report.main([str(run_dir), "--no-png"]) == 0
    header = next(line for line in out.getvalue().splitlines() if "peak mem" in line)
    assert "est. mem" in header, out.getvalue()


def test_a_sweeps_jobs_of_one_memory_are_estimated_once(tmp_path):
    """A Slurm sweep over what holds no tensor (the learning rate): one estimate for its jobs, in one process."""
    sweep = [*TINY, "strategy=single", "launcher=slurm", "cluster=slurm", "cluster.gpu_memory_gb=80"]
    proc = run_cli(["-m", *sweep, "trainer.lr=0.1,0.2,0.3", "dry_run=true", f"hydra.sweep.dir={tmp_path / 'sweep'}"])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "hpc-train: memory check: 3 job(s), 1 distinct to estimate" in proc.stdout, proc.stdout
    assert proc.stdout.count("; memory: ") == 3, proc.stdout


CRASHING_MODEL = '''import torch.nn as nn


class Net(nn.Module):
    """A model whose forward fails as the user's code may (not a shape fake tensors cannot follow)."""

    def __init__(self, **_settings):
        super().__init__()
        self.layer = nn.Linear(4, 4)

    def forward(self, x):
        raise ValueError("boom: the model's own failure")
'''


def test_an_estimate_that_crashes_skips_the_check_under_auto_and_refuses_under_always(tmp_path):
    (tmp_path / "crashy").mkdir()
    (tmp_path / "crashy" / "__init__.py").write_text("")
    (tmp_path / "crashy" / "net.py").write_text(CRASHING_MODEL)
    job = [*TINY, "model=toy_mlp", "model._target_=crashy.net.Net", "cluster.gpu_memory_gb=80", "dry_run=true"]
    auto = run_cli(job, tmp_path / "auto", cwd=tmp_path)
    assert auto.returncode == 0, auto.stdout + auto.stderr
    assert "hpc-train: memory check skipped: the estimate failed: ValueError: boom" in auto.stdout, auto.stdout
    always_job = [*job, "resources.memory_check=always"]
    always = run_cli(always_job, tmp_path / "always", cwd=tmp_path)
    assert always.returncode == rundir.EXIT_REFUSED, always.stdout + always.stderr
    said = always.stdout + always.stderr
    assert "`resources.memory_check`: the memory estimate failed" in said and "ValueError: boom" in said, said
