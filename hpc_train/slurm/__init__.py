"""Slurm's command line: running its commands, its time limits, its host lists (both sides; no torch, no Hydra)."""
