"""The job specs of other settings of the same job: its config composed again with the user's overrides plus a
candidate's (``strategy=fsdp``, ``trainer.activation_checkpointing=blocks`` ...), planned and made into a job spec as
the job itself would be (``make_plan``, ``build_job_spec``), for the memory estimate to read.

Composed with Hydra's compose API in the Hydra app that is running the job (its config name, its search path and its
own overrides, ``HydraConfig``'s ``overrides.task``), or, where the caller composed without a Hydra app (``hydra``'s
``initialize_config_dir``), with the overrides it gives.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

from hydra import compose
from hydra.core.global_hydra import GlobalHydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf, open_dict

from hpc_train.launch.planning.jobspec import build_job_spec, group_choices
from hpc_train.launch.planning.plan import make_plan

CONFIG_NAME = "config"  # hpc-train's own primary config (a Hydra app of the user's names its own)


def specs_for(
    overrides_sets: Sequence[Sequence[str]],
    run_dir: Path,
    base: Optional[Sequence[str]] = None,
    config_name: Optional[str] = None,
) -> List[Dict[str, Any]]:
    """One job spec per set of overrides, each applied over the job's own (`base`; default: the running Hydra app's
    task overrides), planned for `run_dir`. Raises ConfigError where a set makes a config the job's checks refuse."""
    assert GlobalHydra.instance().is_initialized(), "specs_for composes in an initialised Hydra (an app or compose)"
    held = HydraConfig.instance().cfg
    assert held is not None or base is not None, "outside a Hydra app, specs_for needs the job's overrides (base)"
    # the app's search path as it was given (hydra.searchpath=[...]), then the job's overrides (default: the app's)
    paths = [o for o in held.hydra.overrides.hydra if _key(o) == "hydra.searchpath"] if held is not None else []
    if base is None:
        base = list(held.hydra.overrides.task)
    base = [*paths, *base] if not any(_key(o) == "hydra.searchpath" for o in base) else list(base)
    if config_name is None:
        config_name = str(held.hydra.job.config_name) if held is not None else CONFIG_NAME
    return [_spec(config_name, merged(base, extra), run_dir) for extra in overrides_sets]


def merged(base: Sequence[str], extra: Sequence[str]) -> List[str]:
    """`base` with `extra` applied: a base override of a key `extra` sets is left out, and so are a base override's
    keys inside a config group `extra` chooses again (``strategy.dp_shard=2`` under ``strategy=fsdp``)."""
    keys = [_key(override) for override in extra]
    kept = [o for o in base if not any(_key(o) == key or _key(o).startswith(f"{key}.") for key in keys)]
    return [*kept, *extra]


def _key(override: str) -> str:
    return override.split("=", 1)[0].lstrip("+~")


def _spec(config_name: str, overrides: List[str], run_dir: Path) -> Dict[str, Any]:
    """The job spec of one composition: its Hydra config held while it resolves (``${hydra:...}``), then put back."""
    hydra_config = HydraConfig.instance()
    before = hydra_config.cfg
    try:
        cfg = compose(config_name, overrides=overrides, return_hydra_config=True)
        hydra_config.set_config(cfg)
        choices = group_choices(cfg.hydra.runtime.choices)
        with open_dict(cfg):
            del cfg["hydra"]
        OmegaConf.resolve(cfg)
    finally:
        hydra_config.cfg = before
    assert isinstance(cfg, DictConfig)
    return build_job_spec(make_plan(cfg, run_dir), choices=choices)
