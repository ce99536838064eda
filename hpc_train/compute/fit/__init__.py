"""Will the job fit? One rank's peak memory estimated before the job runs: its training step simulated in one
process on fake tensors (no device, no weights) with a fake process group of the job's world size
(:mod:`hpc_train.compute.fit.estimate`), and the peak broken down by what holds it (:mod:`.breakdown`)."""
