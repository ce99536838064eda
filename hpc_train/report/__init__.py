"""hpc-train-report: the reports of runs and sweeps, --watch and --rerun-failed. No torch: a login node runs it."""
