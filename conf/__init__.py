"""The shipped Hydra config dir, installed as the package ``hpc_train.conf``."""

from pathlib import Path

CONFIG_DIR = str(Path(__file__).resolve().parent)
