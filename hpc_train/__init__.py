"""hpc_train: one PyTorch training code path from a laptop to a Slurm supercomputer.

The package is split in two halves that never mix:

* ``hpc_train.launch`` runs on the laptop or the cluster login node: it reads the Hydra
  config, validates it, works out the job layout and starts or submits the job.
  It never imports torch, so it stays fast on a busy login node.
* ``hpc_train.compute`` runs inside every training process: rank detection, data,
  models, strategies and the training loop.
"""

__version__ = "0.1.0"
