"""logger=wandb runs offline on Slurm (compute nodes have no internet) unless told otherwise."""

from __future__ import annotations


def test_wandb_is_offline_on_slurm_unless_told_otherwise(monkeypatch):
    from hpc_train.compute.training.tracker_wandb import wandb_mode

    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    assert wandb_mode(None, slurm_job=True) == "offline"  # the job spec's backend.slurm_job
    assert wandb_mode(None, slurm_job=False) is None  # W&B's own default (online, or what `wandb offline` set)
    assert wandb_mode("online", slurm_job=True) == "online"
    monkeypatch.setenv("SLURM_JOB_ID", "42")  # launcher=local inside an salloc/srun allocation
    assert wandb_mode(None, slurm_job=False) == "offline"
    monkeypatch.setenv("WANDB_MODE", "online")  # the user's environment says so: W&B reads it
    assert wandb_mode(None, slurm_job=True) is None
