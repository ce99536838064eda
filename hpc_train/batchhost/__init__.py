"""The batch host: a Slurm job's outer process, outside any container (hpc_train.batchhost.agent)."""
