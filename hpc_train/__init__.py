"""hpc_train: one PyTorch training code path from a laptop to a Slurm supercomputer.

The package is split in two halves that never mix:

* ``hpc_train.launch`` runs on the laptop or the cluster login node: it reads the Hydra
  config, validates it, works out the job layout and starts or submits the job.
  It never imports torch, so it stays fast on a busy login node.
* ``hpc_train.compute`` runs inside every training process: rank detection, data,
  models, strategies and the training loop.

The public Python API lives here (see ``hpc_train.api``): :func:`compose`, :func:`run`,
:func:`submit`, :func:`sweep`, :class:`Job`, the errors (:class:`HpcTrainError` and its families
:class:`ConfigError`, :class:`Unreachable`, :class:`JobFailed`, :class:`RunDirRefused`, :class:`DiskFull`),
:func:`staged_model` for in-process timing, and :func:`data_shard` for a
user's streamed dataset (which share of the stream this training process reads), and
:func:`log_metrics` for a script of your own run by ``hpc-train ... -- train.py`` (rows of the
run dir's metrics.jsonl), and :func:`report_objective` for a script or Hydra app swept by
``hydra/sweeper=adaptive``. ``import hpc_train``
imports neither torch nor Hydra; the jobs run in their own processes, as with the CLI.
The API module is loaded on first use of one of its names (PEP 562), so the ``hpc-train``
command, which imports submodules of this package, does not pay for it on a login node.
"""

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

__all__ = [
    "ConfigError",
    "DiskFull",
    "HpcTrainError",
    "Job",
    "JobFailed",
    "RunDirRefused",
    "Unreachable",
    "compose",
    "data_shard",
    "log_metrics",
    "report_objective",
    "run",
    "staged_model",
    "submit",
    "sweep",
    "__version__",
]

_ERRORS = ("ConfigError", "DiskFull", "HpcTrainError", "JobFailed", "RunDirRefused", "Unreachable")

if TYPE_CHECKING:
    from hpc_train.api import (  # noqa: F401
        ConfigError,
        DiskFull,
        HpcTrainError,
        Job,
        JobFailed,
        RunDirRefused,
        Unreachable,
        compose,
        run,
        staged_model,
        submit,
        sweep,
    )
    from hpc_train.compute.data.loaders import data_shard  # noqa: F401


def __getattr__(name: str) -> Any:
    if name == "data_shard":  # for the user's streamed dataset, inside a training process
        from hpc_train.compute.data.loaders import data_shard  # on first use (PEP 562): it imports torch

        return data_shard
    if name in ("log_metrics", "report_objective"):  # for a script or Hydra app of your own: no torch, no Hydra
        # on first use (PEP 562): `import hpc_train` loads no submodule
        from hpc_train.records import metrics_log

        return getattr(metrics_log, name)
    if name in _ERRORS:
        from hpc_train import errors  # on first use (PEP 562): a module of classes only, the API not loaded for them

        return getattr(errors, name)
    if name in __all__:
        from hpc_train import api  # on first use (PEP 562): the hpc-train command does not pay for the API module

        return getattr(api, name)
    raise AttributeError(f"module 'hpc_train' has no attribute {name!r}")
