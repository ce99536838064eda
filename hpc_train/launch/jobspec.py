"""The resolved, self-contained job description handed from the launch side to every rank.

It is the composed config with interpolations resolved plus a ``job`` section (run dir and
layout), saved as ``job_config.yaml`` in the run dir so a rank (or a user reading the run
later) needs nothing but that file.
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any, Dict

from omegaconf import DictConfig, OmegaConf, open_dict

from hpc_train import rundir
from hpc_train.launch.plan import RunPlan
from hpc_train.launch.validate import (
    check_resume_compatible,
    code_dirs,
    data_parallel_size,
    normalize_precision,
    resolved_stages,
)


def build_job_spec(cfg: DictConfig, plan: RunPlan) -> Dict[str, Any]:
    cfg = cfg.copy()
    with open_dict(cfg):
        cfg.pop("hydra", None)  # Hydra's own node does not fully resolve in sweep configs, and ranks do not need it
    spec = OmegaConf.to_container(cfg, resolve=True)
    assert isinstance(spec, dict)
    spec["trainer"]["precision"] = normalize_precision(spec["trainer"]["precision"])
    stages = resolved_stages(cfg, plan.layout)
    if stages is not None:
        spec["strategy"]["stages"] = stages
    layout = asdict(plan.layout)
    layout["world_size"] = plan.layout.world_size
    layout["data_parallel_size"] = data_parallel_size(cfg, plan.layout)
    spec["job"] = {
        "run_dir": str(plan.run_dir.resolve()),
        "layout": layout,
        "choices": _choices(),
        "code_dirs": code_dirs(),
    }
    check_resume_compatible(spec, plan.run_dir)
    return spec


def _choices() -> Dict[str, str]:
    """The config-group options this job was composed from (model=resnet18, ...): how runs name their model and data."""
    from hydra.core.hydra_config import HydraConfig

    if not HydraConfig.initialized():
        return {}
    choices = HydraConfig.get().runtime.choices
    return {str(k): str(v) for k, v in choices.items() if not str(k).startswith("hydra/") and v is not None}


def write_job_spec(spec: Dict[str, Any], run_dir: Path) -> Path:
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / rundir.JOB_CONFIG
    path.write_text(OmegaConf.to_yaml(OmegaConf.create(spec)))
    return path
