"""A fresh process's state for one call of the `hpc-train` entry point inside the test's own process.

What `python -m hpc_train.cli` would start from and what the call may leave behind: the command line, the environment,
the working dir and import path, Hydra's singletons (its global state, the job's HydraConfig, the version base) and
OmegaConf's resolvers, hpc_train's per-process module state (the run dir a command made, its once-per-process caches),
logging as Hydra configures it, Python's default warning filters with warnings printed to stderr, the garbage
collector's thresholds and the signal handlers. Each is set as a new process has it on the way in and put back as the
test had it on the way out; a thread the call leaves running is an error (a process would have waited for it, or
killed it).
"""

from __future__ import annotations

import contextlib
import functools
import gc
import importlib
import logging
import os
import signal
import sys
import threading
import warnings
from pathlib import Path
from typing import Callable, Dict, Iterator, List, Tuple

# Python's default warning filters (no -W, no PYTHONWARNINGS), first match first, as a new interpreter has them.
DEFAULT_WARNING_FILTERS: List[Tuple[str, type]] = [
    ("ignore", DeprecationWarning),
    ("ignore", PendingDeprecationWarning),
    ("ignore", ImportWarning),
    ("ignore", ResourceWarning),
]
SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)


@contextlib.contextmanager
def fresh_process(argv: List[str], env: Dict[str, str], cwd: Path) -> Iterator[None]:
    """Inside: the state `python -m hpc_train.cli ARGV` starts from (sys.argv[0] the module's file, as `-m` sets it)."""
    with contextlib.ExitStack() as stack:
        stack.enter_context(_command_line(argv, cwd))
        stack.enter_context(_environment(env))
        stack.enter_context(_hydra_singletons())
        stack.enter_context(_hpc_train_state())
        stack.enter_context(_logging_kept())
        stack.enter_context(_fresh_warnings())
        stack.enter_context(_gc_and_signals_kept())
        stack.enter_context(_no_thread_left())
        yield


def cli_main() -> Callable[[], None]:
    """hpc_train.cli.main, imported as the command imports it. Hydra's plugin scan, when a test composed before (with
    hydra.initialize, say), puts hydra_plugins.hpc_train_launcher into sys.modules without binding it on its package,
    as an import does; hpc_train.cli reads it from the package, so it is bound here as a new process binds it."""
    import hydra_plugins

    hydra_plugins.hpc_train_launcher = importlib.import_module("hydra_plugins.hpc_train_launcher")
    import hpc_train.cli

    return hpc_train.cli.main


@contextlib.contextmanager
def _command_line(argv: List[str], cwd: Path) -> Iterator[None]:
    saved_argv, saved_path, saved_cwd = sys.argv[:], sys.path[:], os.getcwd()
    sys.argv = [str(Path(__file__).resolve().parents[2] / "hpc_train" / "cli.py"), *argv]
    os.chdir(cwd)
    try:
        yield
    finally:
        sys.argv, sys.path[:] = saved_argv, saved_path
        os.chdir(saved_cwd)


@contextlib.contextmanager
def _environment(env: Dict[str, str]) -> Iterator[None]:
    """os.environ is `env` inside (the CLI sets HYDRA_FULL_ERROR, for one); the test's own afterwards."""
    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update(env)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


@contextlib.contextmanager
def _hydra_singletons() -> Iterator[None]:
    """Hydra's per-command singletons cleared (GlobalHydra, HydraConfig, JobRuntime, VersionBase), as a new process
    has none; what its imports and plugin scan made (Plugins, ConfigStore, SourcesRegistry) kept, a new process makes
    the same; all put back afterwards, OmegaConf's resolvers too."""
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.hydra_config import HydraConfig
    from hydra.core.singleton import Singleton
    from hydra.core.utils import JobRuntime
    from hydra.version import VersionBase
    from omegaconf.basecontainer import BaseContainer

    saved, resolvers = dict(Singleton._instances), dict(BaseContainer._resolvers)
    for kind in (GlobalHydra, HydraConfig, JobRuntime, VersionBase):
        Singleton._instances.pop(kind, None)
    try:
        yield
    finally:
        made = dict(Singleton._instances)
        Singleton._instances.clear()
        Singleton._instances.update(saved)
        for kind, instance in made.items():  # a first call's plugin scan, kept for the next call
            if kind not in (GlobalHydra, HydraConfig, JobRuntime, VersionBase):
                Singleton._instances.setdefault(kind, instance)
        BaseContainer._resolvers.clear()
        BaseContainer._resolvers.update(resolvers)


@contextlib.contextmanager
def _hpc_train_state() -> Iterator[None]:
    """hpc_train's module state as a new process has it: no run dir made yet, every once-per-process cache empty."""
    from hpc_train.launch.hydra import hydra_callbacks

    hydra_callbacks._MADE = None
    _clear_caches()
    try:
        yield
    finally:
        hydra_callbacks._MADE = None
        _clear_caches()


def _clear_caches() -> None:
    """Every functools cache at the top level of an imported hpc_train module, and the cluster's remembered answers
    (sinfo's, once per command)."""
    from hpc_train.slurm import slurm_cli

    slurm_cli.forget_answers()
    for name, module in list(sys.modules.items()):
        if module is None or not name.startswith(("hpc_train", "hydra_plugins.hpc_train")):
            continue
        for value in list(vars(module).values()):
            if isinstance(value, functools._lru_cache_wrapper) and getattr(value, "__module__", None) == name:
                value.cache_clear()


@contextlib.contextmanager
def _logging_kept() -> Iterator[None]:
    """Each logger's level, handlers and switches put back after Hydra's logging config; handlers it added closed."""
    saved = {logger: _logger_state(logger) for logger in _loggers()}
    disabled = logging.root.manager.disable
    try:
        yield
    finally:
        for logger in _loggers():
            level, handlers, propagate, off = saved.get(logger, (logging.NOTSET, [], True, False))
            for handler in logger.handlers:
                if handler not in handlers:
                    handler.close()
            logger.handlers[:] = handlers
            logger.setLevel(level)
            logger.propagate, logger.disabled = propagate, off
        logging.disable(disabled)


def _loggers() -> List[logging.Logger]:
    found = logging.root.manager.loggerDict.values()
    return [logging.root, *(logger for logger in found if isinstance(logger, logging.Logger))]


def _logger_state(logger: logging.Logger) -> Tuple[int, list, bool, bool]:
    return logger.level, list(logger.handlers), logger.propagate, logger.disabled


@contextlib.contextmanager
def _fresh_warnings() -> Iterator[None]:
    """A new interpreter's warning filters, a warning printed to (the captured) stderr as Python prints it."""
    with warnings.catch_warnings():
        warnings.resetwarnings()
        for action, category in reversed(DEFAULT_WARNING_FILTERS):
            warnings.simplefilter(action, category)
        warnings.showwarning = _show_warning
        yield


def _show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    sys.stderr.write(warnings.formatwarning(message, category, filename, lineno, line))


@contextlib.contextmanager
def _gc_and_signals_kept() -> Iterator[None]:
    """hpc_train.cli raises the collector's first threshold when imported, and may handle signals: both put back."""
    thresholds, handlers = gc.get_threshold(), {signum: signal.getsignal(signum) for signum in SIGNALS}
    try:
        yield
    finally:
        gc.set_threshold(*thresholds)
        for signum, handler in handlers.items():
            signal.signal(signum, handler)


@contextlib.contextmanager
def _no_thread_left() -> Iterator[None]:
    before = set(threading.enumerate())
    yield
    left = [thread.name for thread in threading.enumerate() if thread not in before and thread.is_alive()]
    assert not left, f"the command left threads running ({', '.join(left)}): run it in its own process (run_cli)"
