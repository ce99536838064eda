"""The Slurm backends, on submitit: a job or array queued (``launcher=slurm``), a run packed into shared
allocations, a plain sbatch script's first command (``launcher=sbatch``); the sbatch parameters, the batch
script's text, the job step's command, Slurm's refusals in words, and following a queued job to its end."""
