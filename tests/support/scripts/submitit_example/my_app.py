"""An app in the shape of hydra-submitit-launcher's example (its config picks hydra/launcher=submitit_slurm): the
task asks submitit which job it runs in and writes it down (tests/slurm/test_any_hydra_app.py)."""

import json
import os

import hydra
import submitit
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig


@hydra.main(version_base=None, config_path=".", config_name="config")
def my_app(cfg: DictConfig) -> None:
    env = submitit.JobEnvironment()
    record = {"task": cfg.task, "job_id": env.job_id, "global_rank": env.global_rank, "pid": os.getpid()}
    with open(os.path.join(HydraConfig.get().runtime.output_dir, "job.json"), "w") as handle:
        json.dump(record, handle)


if __name__ == "__main__":
    my_app()
