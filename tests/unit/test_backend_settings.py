"""The rank side chooses by the job spec's ``backend`` section (how its ranks were started), never by the launcher's
name: the W&B mode and the check of Slurm's stop-signal lead follow ``backend.slurm_job``."""

from __future__ import annotations

import logging
from dataclasses import fields
from pathlib import Path

import pytest

from hpc_train.compute.checkpointing.background import Ticket
from hpc_train.compute.settings import BackendSettings, backend_section
from hpc_train.compute.training.saves import Saves
from hpc_train.compute.training.tracker_wandb import wandb_mode
from hpc_train.config.launcher import LAUNCHERS


def test_the_backend_section_is_what_the_launch_side_writes():
    for kind in LAUNCHERS.values():
        written = kind.rank_settings()
        assert {f.name for f in fields(BackendSettings)} == set(written)
        assert backend_section({"backend": written, "launcher": {"name": "other"}}) == BackendSettings(**written)


def test_the_section_not_the_name_decides():
    # a spec's backend section is read as it is, whatever the launcher's name says; the name and requeue keys a spec
    # written by an earlier version holds there are not read
    spec = {"backend": {"name": "local", "slurm_job": True, "requeue": "scontrol"}, "launcher": {"name": "local"}}
    assert backend_section(spec).slurm_job


@pytest.mark.parametrize("name", sorted(LAUNCHERS))
def test_a_spec_written_before_the_section_reads_its_launchers(name):
    # job_config.yaml of a run dir started before the launch side wrote the section: it still resumes
    assert backend_section({"launcher": {"name": name}}) == BackendSettings(**LAUNCHERS[name].rank_settings())


class _Checkpointer:
    every = 1

    def due(self, step):
        return True

    def save(self, step, why):
        return Ticket(step, Path("/nonexistent"), background=False, started=0.0, total_s=5.0)

    def finished(self, wait):
        return None


class _Metrics:
    def __init__(self):
        self.rows = []

    def write(self, row):
        self.rows.append(row)


@pytest.mark.parametrize("slurm_job", [True, False])
def test_the_stop_signal_lead_is_checked_in_slurm_jobs_only(slurm_job, caplog):
    saves = Saves(_Checkpointer(), _Metrics(), is_main=True, slurm_job=slurm_job, signal_delay_s=1)
    saves.after_step(1, lambda: None)  # the first step: not measured
    with caplog.at_level(logging.WARNING, logger="hpc_train"):
        saves.after_step(2, lambda: None)  # measured, and a 5 s checkpoint: more than the 1 s lead
    late = [r for r in caplog.records if "launcher.signal_delay_s=1 is shorter" in r.getMessage()]
    assert len(late) == (1 if slurm_job else 0)
    assert saves.lead_checked == slurm_job
    assert [row["kind"] for row in saves.metrics.rows] == ["checkpoint", "checkpoint"]


def test_wandb_follows_the_backend_section(monkeypatch):
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    for kind in LAUNCHERS.values():
        backend = BackendSettings(**kind.rank_settings())
        assert wandb_mode(None, backend.slurm_job) == ("offline" if kind.slurm_job else None)
