"""Checks that need the whole Hydra config of a multirun, before its sweeper starts anything.

Registered in conf/config.yaml under ``hydra.callbacks``; Hydra calls ``on_multirun_start``
after composing the sweep's config and before it builds the sweeper and the launcher.
"""

from __future__ import annotations

from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from hpc_train.launch.errors import ConfigError
from hpc_train.launch.objective import check_objective

# Launchers that would wrap hpc-train's own launcher in one more Slurm job of a fixed shape.
REFUSED_LAUNCHERS = {
    "hydra_plugins.hydra_submitit_launcher.submitit_launcher.SlurmLauncher": "submitit_slurm",
    "hydra_plugins.hydra_submitit_launcher.submitit_launcher.LocalLauncher": "submitit_local",
    # hpc_train's own launchers for other Hydra apps (hpc_train.launch.app_launcher): the same trap
    "hydra_plugins.hpc_train_launcher.AppSlurmLauncher": "hpc_train_slurm",
    "hydra_plugins.hpc_train_launcher.AppLocalLauncher": "hpc_train_local",
}


class Refused(BaseException):
    """A ConfigError raised from a callback.

    Hydra turns an Exception raised in a callback into a warning and carries on; a
    BaseException passes through to hpc_train.cli.main, which prints the ConfigError.
    """

    def __init__(self, error: ConfigError) -> None:
        super().__init__(error.message)
        self.error = error


class LaunchGuard(Callback):
    """Refuse launcher choices that cannot work and dry runs a sweeper cannot optimise."""

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
