"""Packed sweeps below both sides: the pool's records, its scheduler on an allocation's batch host, and the runs'
states.

The login node plans and submits the allocations (hpc_train.launch.backends.slurm.packed); no torch here.
"""
