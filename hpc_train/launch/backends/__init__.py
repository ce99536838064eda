"""The ways a job runs: local processes, Slurm arrays, packed allocations, plain sbatch scripts, torchrun; following, rerunning."""
