"""The ways a job runs, one class each on one interface (``base.py``; ``registry.py`` picks one): ``local/``
(processes of this machine, torchrun) and ``slurm/`` (arrays, packed allocations, plain sbatch scripts). Beside
them, what every backend shares: one job's launch side (``run.py``), a sweep's failures rerun (``rerun.py``) and a
job a laptop follows (``remote_watch.py``)."""
