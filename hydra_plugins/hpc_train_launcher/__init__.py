"""Registers hpc-train's sweep launcher as `hydra/launcher=hpc_train`.

Hydra only instantiates launchers that live under the `hydra_plugins` package, so this is a
thin shim over `hpc_train.launch.sweep.SweepLauncher`. `hpc_train.cli` imports it explicitly,
which also works for editable installs (where Hydra's own plugin scan cannot see it).
"""

from dataclasses import dataclass
from typing import Any, Dict, Optional

from hydra.core.config_store import ConfigStore

from hpc_train.launch.sweep import SweepLauncher


class HpcTrainLauncher(SweepLauncher):
    pass


@dataclass
class HpcTrainLauncherConf:
    _target_: str = "hydra_plugins.hpc_train_launcher.HpcTrainLauncher"


ConfigStore.instance().store(group="hydra/launcher", name="hpc_train", node=HpcTrainLauncherConf, provider="hpc_train")


def _make_sweeper_class() -> type:
    """Hydra's basic sweeper without its up-front full composition of every job.

    BasicSweeper composes each job once just to validate it (~0.1 s a job); the hpc_train
    launcher composes and validates every job itself before anything runs or is queued,
    sharing compositions between jobs, and reports bad overrides in Hydra's own words.
    Built after Hydra's plugin scan, which re-executes the module defining BasicSweeper.
    """
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper

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
    """Make sure Hydra knows the launcher class (called by hpc_train.cli before Hydra starts).

    Hydra only instantiates plugin classes its scan of `hydra_plugins` found; that scan misses
    packages served by setuptools' editable finder (`pip install -e .`), so add the class by
    hand. Harmless when the scan did find it.
    """
    from hydra.core.plugins import Plugins

    plugins = Plugins.instance()  # runs Hydra's plugin scan first
    global HpcTrainSweeper
    HpcTrainSweeper = _make_sweeper_class()
    plugins.class_name_to_class[f"{__name__}.HpcTrainSweeper"] = HpcTrainSweeper
    plugins.class_name_to_class.setdefault(f"{__name__}.HpcTrainLauncher", HpcTrainLauncher)
