"""Every Hydra internal hpc_train relies on, in one place: Hydra has no public API for these.

Tested with hydra-core 1.3 (the range pyproject.toml declares). ``tests/unit/test_hydra_internals.py``
checks each one against the installed Hydra and fails naming what moved, so an upgrade that
breaks one of them is found by the test suite, not by a user. Imports are done on use:
``hpc_train.launch.hydra.cli_child`` imports this module, and with it ``hpc_train.api`` and
``hpc-train-report --watch``, which need no Hydra until they compose or expand a sweep.

* the basic sweeper's class (hpc-train's own sweeper extends it; its job expansion numbers jobs);
* building Hydra's global state and search path as ``hydra.main`` does, for ``--config-dir``
  (the Python API's compose), and putting the caller's state back after;
* ``hydra.job.override_dirname`` as Hydra computes it (sweep jobs composed by the launcher);
* Hydra's command-line parser and the frame its flag check raises from (one message for
  ``--resolve`` without ``--cfg`` and the like);
* a failed job's ``JobReturn`` whose value the sweeper reads (``_ = r.return_value``) raises without the getter's
  ``Error executing job with overrides: [...]`` line (a failure hpc-train has said in its own words).
"""

from __future__ import annotations

import functools
from dataclasses import fields
from typing import Any, List

BASIC_SWEEPER = "hydra._internal.core_plugins.basic_sweeper.BasicSweeper"  # its _target_, as configs name it
FLAG_CHECK_FRAME = ("hydra._internal.utils", "_run_hydra")  # (module, function) of Hydra's flag check


def basic_sweeper_class() -> type:
    # on use: Hydra's plugin scan re-executes basic_sweeper's module; take the class it leaves
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper

    return BasicSweeper


def create_main_hydra(task_name: str, search_path: Any) -> Any:
    """Hydra's global state with this search path, as hydra.main creates it; one already set (the Hydra app this runs
    in: its launcher composing a cluster profile) is cleared first, the caller having taken its backup."""
    # Hydra (~0.2 s) on use: hpc_train.api and hpc-train-report --watch import this module without it
    from hydra._internal.hydra import Hydra
    from hydra.core.global_hydra import GlobalHydra

    GlobalHydra.instance().clear()
    return Hydra.create_main_hydra2(task_name=task_name, config_search_path=search_path)


def config_search_path(config_dir: str) -> Any:
    """Hydra's search path for a primary config dir, plugins' paths included, as hydra.main builds it."""
    # Hydra (~0.2 s) on use: hpc_train.api and hpc-train-report --watch import this module without it
    from hydra._internal.utils import create_config_search_path

    return create_config_search_path(config_dir)


def overrides_dirname(overrides: List[str], kv_sep: str, item_sep: str, exclude_keys: List[str]) -> str:
    """``hydra.job.override_dirname`` of a job, as Hydra computes it."""
    # Hydra (~0.2 s) on use: hpc_train.api and hpc-train-report --watch import this module without it
    from hydra._internal.config_loader_impl import get_overrides_dirname

    return get_overrides_dirname(overrides=overrides, kv_sep=kv_sep, item_sep=item_sep, exclude_keys=exclude_keys)


def global_hydra_backup() -> Any:
    """Hydra's global state, to put back later (what hydra.initialize's context managers do on exit)."""
    # Hydra (~0.2 s) on use: hpc_train.api and hpc-train-report --watch import this module without it
    from hydra.initialize import get_gh_backup

    return get_gh_backup()


def restore_global_hydra(backup: Any) -> None:
    # Hydra (~0.2 s) on use: hpc_train.api and hpc-train-report --watch import this module without it
    from hydra.initialize import restore_gh_from_backup

    restore_gh_from_backup(backup)


def args_parser() -> Any:
    """Hydra's own argparse parser of an app's command line."""
    # Hydra (~0.2 s) on use: hpc_train.api and hpc-train-report --watch import this module without it
    from hydra._internal.utils import get_args_parser

    return get_args_parser()


def job_error(ret: Any) -> Any:
    """A failed job's error (a Hydra ``JobReturn``'s), read without the getter's line; None for a job that did not
    fail."""
    # Hydra (~0.2 s) on use: hpc_train.api and hpc-train-report --watch import this module without it
    from hydra.core.utils import JobStatus

    return ret._return_value if ret.status == JobStatus.FAILED else None


def quiet_failure(ret: Any) -> Any:
    """`ret` (a Hydra ``JobReturn``) as one whose failure, read by the sweeper, raises its error without Hydra's
    ``Error executing job with overrides: [...]`` on stderr: the error says what failed and is already printed."""
    return _quiet_return_class()(**{field.name: getattr(ret, field.name) for field in fields(ret)})


@functools.lru_cache(maxsize=None)
def _quiet_return_class() -> type:
    # Hydra (~0.2 s) on use: hpc_train.api and hpc-train-report --watch import this module without it
    from hydra.core.utils import JobReturn, JobStatus

    class QuietFailure(JobReturn):
        """A JobReturn whose getter raises a failed job's error as Hydra's does, without writing a line first."""

        @property
        def return_value(self) -> Any:
            if self.status == JobStatus.COMPLETED:
                return self._return_value
            raise self._return_value

        @return_value.setter
        def return_value(self, value: Any) -> None:
            self._return_value = value

    return QuietFailure


# (module, attribute path) of each internal above: what tests/unit/test_hydra_internals.py checks.
INTERNALS = [
    ("hydra._internal.core_plugins.basic_sweeper", "BasicSweeper"),
    ("hydra._internal.hydra", "Hydra.create_main_hydra2"),
    ("hydra._internal.utils", "create_config_search_path"),
    ("hydra._internal.config_loader_impl", "get_overrides_dirname"),
    ("hydra._internal.utils", "get_args_parser"),
    ("hydra.initialize", "get_gh_backup"),
    ("hydra.initialize", "restore_gh_from_backup"),
    ("hydra.core.utils", "JobReturn"),
    FLAG_CHECK_FRAME,
]
