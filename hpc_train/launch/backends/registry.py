"""Which backend runs a launcher's jobs: the one place where a launcher's name picks code.

``launcher.name`` (``local``, ``slurm``, ``sbatch``: declared with what each is in ``config.launcher.LAUNCHERS``)
and the Hydra app launchers (``hydra/launcher=hpc_train_local|hpc_train_slurm``, declared with the backend of their
jobs in ``config.launcher.APP_LAUNCHERS``) map to a backend class here; nothing else compares a launcher's name
(``tests/unit/test_launcher_registry.py`` holds the package to that). A new way of running jobs is a class on
``base.Backend``, a row in ``LAUNCHERS`` and a row here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, Type

from hpc_train.config.engine import checked_view
from hpc_train.config.launcher import APP_LAUNCHERS, LauncherKind, launcher_kind
from hpc_train.config.view import ConfigView
from hpc_train.launch.backends.base import Backend
from hpc_train.launch.backends.local.backend import LocalBackend
from hpc_train.launch.backends.run import run_job
from hpc_train.launch.backends.slurm.backend import SlurmBackend
from hpc_train.launch.backends.slurm.sbatch import SbatchBackend

BACKENDS: Dict[str, Type[Backend]] = {
    "local": LocalBackend,
    "slurm": SlurmBackend,
    "sbatch": SbatchBackend,
}


def backend_for(name: Any) -> Backend:
    """The backend of ``launcher.name`` (a name the config's check accepted: one of LAUNCHERS)."""
    kind: LauncherKind = launcher_kind(name)
    return BACKENDS[kind.name](kind)


def app_backend(app_launcher: str) -> Backend:
    """The backend that runs the jobs of a Hydra app launcher (its name in ``hydra/launcher``)."""
    return backend_for(APP_LAUNCHERS[app_launcher].backend)


def run_configured(cfg: Any, run_dir: Path, wait: bool = False) -> int:
    """hpc-train's one job (``cfg``, a composed config): every key checked, then run by its launcher's backend."""
    view = cfg if isinstance(cfg, ConfigView) else checked_view(cfg)
    return run_job(backend_for(view.launcher.name), view, run_dir, wait)
