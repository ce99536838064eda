"""The skeleton both of hpc_train's Hydra launchers share: hpc-train's own sweeps (``sweep.SweepLauncher``) and any
Hydra app's (``app_launcher.AppLauncher``). Hydra hands a launcher its context once (``setup``) and a batch of
jobs at a time (``launch``); the sweep dir's status says whether the sweep is at work, done or refused, which
``hpc-train-report --watch`` reads."""

from __future__ import annotations

import abc
from pathlib import Path
from typing import Optional, Sequence

from hydra.core.utils import JobReturn, setup_globals
from hydra.plugins.launcher import Launcher
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig

from hpc_train.config.errors import ConfigError
from hpc_train.jobs import sweep_status


class SweepLauncherBase(Launcher, abc.ABC):
    """Hydra's context kept at ``setup``; each ``launch`` marks the sweep dir running, runs ``_launch`` and marks
    it done, or refused (with the refusal's message) when the batch was refused as a whole."""

    def __init__(self) -> None:
        self.config: Optional[DictConfig] = None
        self.hydra_context: Optional[HydraContext] = None
        self.task_function: Optional[TaskFunction] = None

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        self.config, self.hydra_context, self.task_function = config, hydra_context, task_function

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        setup_globals()
        assert self.config is not None and self.task_function is not None and self.hydra_context is not None
        self._before_launch(self.config)
        sweep_dir = Path(str(self.config.hydra.sweep.dir))
        sweep_dir.mkdir(parents=True, exist_ok=True)
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
    def _launch(
        self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int, sweep_dir: Path
    ) -> Sequence[JobReturn]:
        """This batch's jobs: checked, run or queued, their returns in Hydra's job order."""
