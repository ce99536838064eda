"""The run directory and the records a run leaves in it: file names, exit codes, atomic writes, the claim on a run dir,
metrics, hangs, rank errors (both sides; no torch, no Hydra)."""
