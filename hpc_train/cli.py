"""The `hpc-train` command: a Hydra app over conf/ (login-node safe: no torch import)."""

from __future__ import annotations

import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

import hpc_train.conf
from hpc_train.launch.errors import ConfigError

CONFIG_DIR = str(Path(hpc_train.conf.__file__).resolve().parent)


@hydra.main(version_base="1.3", config_path=CONFIG_DIR, config_name="config")
def _app(cfg: DictConfig) -> None:
    from hpc_train.launch.run import run_job

    run_dir = Path(HydraConfig.get().runtime.output_dir)
    try:
        code = run_job(cfg, run_dir)
    except ConfigError as err:
        print(err.message, file=sys.stderr)
        sys.exit(2)
    if code != 0:
        sys.exit(code)


def main() -> None:
    _app()


if __name__ == "__main__":
    main()
