"""A Hydra app that knows nothing of hpc_train: it reports the GPUs Slurm gave it, or fails."""

import json
import os
import sys
import time

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig


@hydra.main(version_base=None, config_path=".", config_name="config")
def main(cfg: DictConfig) -> int:
    if cfg.fail:
        raise RuntimeError(f"my_app was asked to fail (gpus={cfg.gpus})")
    if cfg.needs is not None and not os.path.exists(cfg.needs):  # fails until the file is there (a rerun's test)
        raise FileNotFoundError(f"my_app needs {cfg.needs}")
    restarts = int(os.environ.get("SLURM_RESTART_COUNT", "0"))
    with open(os.path.join(HydraConfig.get().runtime.output_dir, "attempts.txt"), "a") as handle:
        handle.write(f"{os.environ.get('SLURM_JOB_ID')} {restarts}\n")
    if cfg.sleep_s and restarts == 0:  # a long first attempt, for a preemption to interrupt
        time.sleep(cfg.sleep_s)
    names = ("SLURM_JOB_ID", "SLURM_GPUS_ON_NODE", "SLURM_JOB_PARTITION", "SLURM_CPUS_PER_TASK", "FROM_PROFILE")
    seen = {key: os.environ.get(key) for key in names}
    seen["python"] = sys.executable  # which interpreter ran the job (an image's own, in a container)
    with open(os.path.join(HydraConfig.get().runtime.output_dir, "seen.json"), "w") as handle:
        json.dump(seen, handle)
    return int(cfg.gpus)


if __name__ == "__main__":
    main()
