"""Checks that need the whole Hydra config, before Hydra starts anything.

Registered in conf/config.yaml under ``hydra.callbacks``; Hydra calls ``on_multirun_start``
after composing the sweep's config and before it builds the sweeper and the launcher, and
``on_run_start`` before a single run's Hydra writes its files into the run dir.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Union

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from hpc_train.config.errors import ConfigError
from hpc_train.config.launcher import LAUNCHERS
from hpc_train.launch.backends import torchrun_client
from hpc_train.launch.planning.errors import JobFailed
from hpc_train.launch.planning.objective import check_objective
from hpc_train.records import run_claim
from hpc_train.records.rundir import EXIT_REFUSED

# Launchers that would wrap hpc-train's own launcher in one more Slurm job of a fixed shape.
REFUSED_LAUNCHERS = {
    "hydra_plugins.hydra_submitit_launcher.submitit_launcher.SlurmLauncher": "submitit_slurm",
    "hydra_plugins.hydra_submitit_launcher.submitit_launcher.LocalLauncher": "submitit_local",
    # hpc_train's own launchers for other Hydra apps (hpc_train.launch.hydra.app_launcher): the same trap
    "hydra_plugins.hpc_train_launcher.AppSlurmLauncher": "hpc_train_slurm",
    "hydra_plugins.hpc_train_launcher.AppLocalLauncher": "hpc_train_local",
}


class Refused(BaseException):
    """A ConfigError (or a launch refused as JobFailed) raised from a callback.

    Hydra turns an Exception raised in a callback into a warning and carries on; a
    BaseException passes through to hpc_train.cli.main, which prints the error.
    """

    def __init__(self, error: Union[ConfigError, JobFailed]) -> None:
        super().__init__(str(error))
        self.error = error


class LaunchGuard(Callback):
    """Refuse launcher choices that cannot work and dry runs a sweeper cannot optimise."""

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        """A run dir that a live job holds is refused before Hydra writes .hydra/ and its log into it."""
        kind = LAUNCHERS.get(str(OmegaConf.select(config, "launcher.name", default=None)))
        if config.get("dry_run") or kind is None or kind.prepares_only or torchrun_client.active():
            # a bad name is refused with the other keys; a plain sbatch script's step claims nothing; under torchrun
            # every rank starts here, and rank 0 claims the run dir for all of them
            return
        try:
            run_dir = Path(str(OmegaConf.select(config, "hydra.run.dir")))
        except Exception:  # an interpolation Hydra resolves later (the job's own output dir): run_job checks it
            return
        try:
            run_claim.check_free(run_dir)
        except run_claim.RunDirBusy as busy:
            raise Refused(JobFailed(str(busy), exit_code=EXIT_REFUSED)) from None

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        try:
            self._check(config)
        except ConfigError as err:
            raise Refused(err) from None

    @staticmethod
    def _check(config: DictConfig) -> None:
        target = str(OmegaConf.select(config, "hydra.launcher._target_", default="") or "")
        if target in REFUSED_LAUNCHERS:
            name = REFUSED_LAUNCHERS[target]
            raise ConfigError(
                "hydra/launcher",
                f"hydra/launcher={name} would give every job of the sweep the one sbatch shape of hydra.launcher and"
                " run hpc-train's local launcher inside it, ignoring each job's strategy layout.",
                "keep hydra/launcher=hpc_train (the default) and pass launcher=slurm: it submits every job through"
                " submitit with its own layout.",
            )
        check_objective(config, config.hydra)
