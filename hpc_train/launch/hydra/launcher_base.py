"""The skeleton both of hpc_train's Hydra launchers share: hpc-train's own sweeps (``sweep.SweepLauncher``) and any
Hydra app's (``app_launcher.AppLauncher``). Hydra hands a launcher its context once (``setup``) and a batch of
jobs at a time (``launch``); the sweep dir's status says whether the sweep is at work, done or refused, which
``hpc-train-report --watch`` reads."""

from __future__ import annotations

import abc
from pathlib import Path
from typing import Optional, Sequence

from hydra.core.utils import JobReturn, filter_overrides, setup_globals
from hydra.plugins.launcher import Launcher
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig

from hpc_train.config.errors import ConfigError
from hpc_train.jobs import sweep_status
from hpc_train.launch.hydra import sweep_dir as taken


class SweepLauncherBase(Launcher, abc.ABC):
    """Hydra's context kept at ``setup``; each ``launch`` marks the sweep dir running, runs ``_launch`` and marks
    it done, or refused (with the refusal's message) when the batch was refused as a whole. The first batch is
    refused first, leaving the sweep dir as it is, when another sweep's runs hold the sweep dir
    (hpc_train.launch.hydra.sweep_dir); a dry run leaves the sweep dir as it was found (or none). What it was is
    taken at ``setup``, which Hydra's sweeper calls before it writes its multirun.yaml into the sweep dir; a sweep
    dir named by the clock is made there for this sweep alone (hpc_train.launch.hydra.sweep_dir.found_for)."""

    def __init__(self) -> None:
        self.config: Optional[DictConfig] = None
        self.hydra_context: Optional[HydraContext] = None
        self.task_function: Optional[TaskFunction] = None
        self._sweep_dir_checked = False
        self._found: Optional[taken.Found] = None

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        self.config, self.hydra_context, self.task_function = config, hydra_context, task_function
        self._found = taken.found_for(config)  # a sweep dir named by the clock: this command's own

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        setup_globals()
        assert self.config is not None and self.task_function is not None and self.hydra_context is not None
        self._before_launch(self.config)
        sweep_dir = Path(str(self.config.hydra.sweep.dir))
        sweep_dir.mkdir(parents=True, exist_ok=True)
        if self._dry_run():  # nothing is queued or recorded: the sweep dir is put back as it was found
            try:
                self._check_sweep_dir(sweep_dir, job_overrides, initial_job_idx)
                return self._launch(job_overrides, initial_job_idx, sweep_dir)
            finally:
                self._put_back()
        self._check_sweep_dir(sweep_dir, job_overrides, initial_job_idx)
        sweep_status.mark_running(sweep_dir)
        try:
            returns = self._launch(job_overrides, initial_job_idx, sweep_dir)
        except ConfigError as err:  # refused as a whole: say so to hpc-train-report --watch too
            sweep_status.mark_refused(sweep_dir, err.message)
            raise
        sweep_status.mark_done(sweep_dir)
        return returns

    def _before_launch(self, config: DictConfig) -> None:
        """What a launcher sets up before its first job (nothing by default)."""

    @abc.abstractmethod
    def _dry_run(self) -> bool:
        """Whether this sweep only prints what it would run (the launcher's own key)."""

    def _put_back(self) -> None:
        if self._found is not None:
            self._found.put_back()

    def _check_sweep_dir(self, sweep_dir: Path, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> None:
        """At the sweep's first batch (later batches are this sweep's own), unless another host runs the sweep."""
        if self._sweep_dir_checked or self._runs_elsewhere():
            return
        self._sweep_dir_checked = True
        jobs = [(initial_job_idx + i, filter_overrides(o)) for i, o in enumerate(job_overrides)]
        try:
            taken.check(sweep_dir, jobs)
        except ConfigError as err:
            self._put_back()  # Hydra's sweeper has written its multirun.yaml over the other sweep's
            self._refuse_taken(err)

    def _runs_elsewhere(self) -> bool:
        """Whether the cluster's hpc_train runs this sweep (forwarded from a laptop): it checks the sweep dir there."""
        return False

    def _refuse_taken(self, err: ConfigError) -> None:
        """The sweep dir refused: raised, for hpc-train's command to say (one message, exit code 2)."""
        raise err

    @abc.abstractmethod
    def _launch(
        self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int, sweep_dir: Path
    ) -> Sequence[JobReturn]:
        """This batch's jobs: checked, run or queued, their returns in Hydra's job order."""
