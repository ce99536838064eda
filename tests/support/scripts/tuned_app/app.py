"""A plain Hydra app (hpc_train only for its one reporting call): gradient descent on (w - 3)^2 for `steps` steps at
learning rate `lr`, its state kept in its output dir (a later run there resumes it), the loss reported every step."""

import json
import os

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

import hpc_train


@hydra.main(version_base=None, config_path=".", config_name="config")
def main(cfg: DictConfig) -> float:
    state_file = os.path.join(HydraConfig.get().runtime.output_dir, "state.json")
    state = {"w": 0.0, "step": 0}
    if os.path.exists(state_file):
        with open(state_file) as handle:
            state = json.load(handle)
    with open(os.path.join(HydraConfig.get().runtime.output_dir, "runs.txt"), "a") as handle:
        handle.write(f"{state['step']} {cfg.steps}\n")  # where each run began, and its budget
    w = state["w"]
    for step in range(state["step"] + 1, cfg.steps + 1):
        w -= cfg.lr * 2 * (w - 3.0)
        hpc_train.report_objective(step, (w - 3.0) ** 2)
    with open(state_file, "w") as handle:
        json.dump({"w": w, "step": cfg.steps}, handle)
    return (w - 3.0) ** 2


if __name__ == "__main__":
    main()
