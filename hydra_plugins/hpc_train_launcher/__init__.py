"""Registers hpc_train's launchers with Hydra.

* `hydra/launcher=hpc_train`: hpc-train's own sweeps (`hpc_train.launch.hydra.sweep.SweepLauncher`);
* `hydra/launcher=hpc_train_slurm` and `hpc_train_local`: any Hydra app's sweeps, a drop-in for
  hydra-submitit-launcher's `submitit_slurm` / `submitit_local` (`hpc_train.launch.hydra.app_launcher`);
* `hydra/sweeper=adaptive`: an asynchronous study that stops poor trials early (`hpc_train.tune`).

Hydra only instantiates launchers that live under the `hydra_plugins` package, so these are
thin shims. Hydra's plugin scan finds this package in a normal install and in an editable one
(the src layout makes `pip install -e .` a plain .pth entry, which the scan can list).
"""

from dataclasses import dataclass
from typing import Any, Dict, Optional

from hydra.core.config_store import ConfigStore

from hpc_train.config.launcher import APP_LAUNCHERS
from hpc_train.launch.hydra.app_config import APP_CONFS
from hpc_train.launch.hydra.app_launcher import AppLauncher
from hpc_train.launch.hydra.sweep import SweepLauncher
from hpc_train.tune.settings import TuneConf
from hpc_train.tune.sweeper import OWN_LAUNCHER
from hpc_train.tune.sweeper import AdaptiveSweeper as _AdaptiveSweeperBase


class HpcTrainLauncher(SweepLauncher):
    pass


# One class per app launcher (AppSlurmLauncher, AppLocalLauncher), each named once in config.launcher.APP_LAUNCHERS.
for _kind in APP_LAUNCHERS.values():
    globals()[_kind.class_name] = type(
        _kind.class_name, (AppLauncher,), {"launcher_name": _kind.name, "__module__": __name__}
    )
    ConfigStore.instance().store(
        group="hydra/launcher", name=_kind.name, node=APP_CONFS[_kind.name], provider="hpc_train"
    )


@dataclass
class HpcTrainLauncherConf:
    _target_: str = OWN_LAUNCHER


ConfigStore.instance().store(group="hydra/launcher", name="hpc_train", node=HpcTrainLauncherConf, provider="hpc_train")


def _make_sweeper_class() -> type:
    """Hydra's basic sweeper without its up-front full composition of every job.

    BasicSweeper composes each job once just to validate it (~0.1 s a job); the hpc_train
    launcher composes and validates every job itself before anything runs or is queued,
    sharing compositions between jobs, and reports bad overrides in Hydra's own words.
    Built after Hydra's plugin scan, which re-executes the module defining BasicSweeper.
    """
    from hpc_train.launch.hydra.hydra_internals import basic_sweeper_class

    BasicSweeper = basic_sweeper_class()

    def validate_batch_is_legal(self: Any, batch: Any) -> None:
        return None

    return type(
        "HpcTrainSweeper", (BasicSweeper,), {"validate_batch_is_legal": validate_batch_is_legal, "__module__": __name__}
    )


@dataclass
class HpcTrainSweeperConf:
    _target_: str = "hydra_plugins.hpc_train_launcher.HpcTrainSweeper"
    max_batch_size: Optional[int] = None
    params: Optional[Dict[str, str]] = None


ConfigStore.instance().store(group="hydra/sweeper", name="hpc_train", node=HpcTrainSweeperConf, provider="hpc_train")


HpcTrainSweeper: Optional[type] = None  # built by register()


def register() -> None:
    """Add hpc-train's sweeper to Hydra's plugins (called by hpc_train.cli before Hydra starts).

    The sweeper class is built after Hydra's plugin scan (see _make_sweeper_class), so the scan
    cannot list it: it is added to the scan's table by hand.
    """
    from hydra.core.plugins import Plugins

    plugins = Plugins.instance()  # runs Hydra's plugin scan first
    global HpcTrainSweeper
    HpcTrainSweeper = _make_sweeper_class()
    plugins.class_name_to_class[f"{__name__}.HpcTrainSweeper"] = HpcTrainSweeper


class AdaptiveSweeper(_AdaptiveSweeperBase):
    pass


@dataclass
class AdaptiveSweeperConf(TuneConf):
    _target_: str = "hydra_plugins.hpc_train_launcher.AdaptiveSweeper"


ConfigStore.instance().store(group="hydra/sweeper", name="adaptive", node=AdaptiveSweeperConf, provider="hpc_train")
