"""Registers hpc-train's sweep launcher as `hydra/launcher=hpc_train`.

Hydra only instantiates launchers that live under the `hydra_plugins` package, so this is a
thin shim over `hpc_train.launch.sweep.SweepLauncher`. `hpc_train.cli` imports it explicitly,
which also works for editable installs (where Hydra's own plugin scan cannot see it).
"""

from dataclasses import dataclass

from hydra.core.config_store import ConfigStore

from hpc_train.launch.sweep import SweepLauncher


class HpcTrainLauncher(SweepLauncher):
    pass


@dataclass
class HpcTrainLauncherConf:
    _target_: str = "hydra_plugins.hpc_train_launcher.HpcTrainLauncher"


ConfigStore.instance().store(group="hydra/launcher", name="hpc_train", node=HpcTrainLauncherConf, provider="hpc_train")


def register() -> None:
    """Make sure Hydra knows the launcher class (called by hpc_train.cli before Hydra starts).

    Hydra only instantiates plugin classes its scan of `hydra_plugins` found; that scan misses
    packages served by setuptools' editable finder (`pip install -e .`), so add the class by
    hand. Harmless when the scan did find it.
    """
    from hydra.core.plugins import Plugins

    Plugins.instance().class_name_to_class.setdefault(f"{__name__}.HpcTrainLauncher", HpcTrainLauncher)
