"""A Hydra app of the user's own, run as a script (tests/e2e/test_scripts_dist.py).

``hpc-train script.arg_style='{key}={value}' +script.overrides.lr=0.1 -- tests/support/scripts/hydra_app.py
'hydra.run.dir=${hydra:runtime.output_dir}/app'``: hpc_train appends ``lr=0.1`` to its command line,
which Hydra parses as an override of the app's own config. The app writes what it received (each
value with its Python type name) and where Hydra ran it to ``received.json`` in
``$HPC_TRAIN_RUN_DIR`` (else its own run dir).
"""

import json
import os
from pathlib import Path

import hydra
from hydra.core.config_store import ConfigStore
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

# Untyped on purpose: each value keeps the type Hydra's own parser gives the text on the command line.
ConfigStore.instance().store(name="app_config", node={"lr": 0.5, "steps": 2, "flag": True, "name": "app", "dims": [8]})


@hydra.main(version_base=None, config_name="app_config")
def main(cfg: DictConfig) -> None:
    values = OmegaConf.to_container(cfg)
    assert isinstance(values, dict)
    record = {
        "config": values,
        "types": {key: type(value).__name__ for key, value in values.items()},
        "overrides": list(HydraConfig.get().overrides.task),
        "app_output_dir": HydraConfig.get().runtime.output_dir,
        "cwd": os.getcwd(),
    }
    out = Path(os.environ.get("HPC_TRAIN_RUN_DIR") or HydraConfig.get().runtime.output_dir)
    (out / "received.json").write_text(json.dumps(record, indent=1))
    print(f"hydra app: lr={cfg.lr!r} steps={cfg.steps!r} in {record['app_output_dir']}", flush=True)


if __name__ == "__main__":
    main()
