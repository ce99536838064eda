"""The ways a job runs, one class each on one interface (base.py; the registry picks one): local processes,
Slurm arrays, packed allocations, plain sbatch scripts, torchrun; following a job, rerunning a sweep's failures."""
