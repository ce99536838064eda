"""The `hpc-train` command: a Hydra app over conf/ (login-node safe: no torch import)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import List

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

import hpc_train.conf
import hydra_plugins.hpc_train_launcher  # noqa: F401  registers hydra/launcher=hpc_train (per-job Slurm layouts in sweeps)
from hpc_train.launch.errors import ConfigError
from hpc_train.launch.overrides import check_overrides

CONFIG_DIR = str(Path(hpc_train.conf.__file__).resolve().parent)


@hydra.main(version_base="1.3", config_path=CONFIG_DIR, config_name="config")
def _app(cfg: DictConfig) -> None:
    from hpc_train.launch.run import run_job

    run_dir = Path(HydraConfig.get().runtime.output_dir)
    try:
        if cfg.launcher.name == "sbatch":  # inside a plain sbatch script: check the allocation, write the job spec
            from hpc_train.launch.sbatch import prepare

            code = prepare(cfg, run_dir)
        else:
            code = run_job(cfg, run_dir)
    except ConfigError as err:
        print(err.message, file=sys.stderr)
        sys.exit(2)
    if code != 0:
        sys.exit(code)


def _precheck_output_dirs(argv: List[str]) -> None:
    """Hydra creates the run dir before our code runs; refuse an unusable one with a clear message first."""
    from hpc_train.launch.validate import check_output_dir

    multirun = any(arg in ("-m", "--multirun") for arg in argv)
    key = "hydra.sweep.dir" if multirun else "hydra.run.dir"
    given = [arg.split("=", 1)[1] for arg in argv if arg.startswith(key + "=")]
    check_output_dir(Path(given[-1]) if given else Path.cwd(), key)


def main() -> None:
    try:
        _precheck_output_dirs(sys.argv[1:])
        check_overrides(sys.argv[1:], Path(CONFIG_DIR))
    except ConfigError as err:
        print(err.message, file=sys.stderr)
        sys.exit(2)
    hydra_plugins.hpc_train_launcher.register()
    _app()


if __name__ == "__main__":
    main()
