"""The resolved, self-contained job description handed from the launch side to every rank.

It is the composed config with interpolations resolved plus a ``job`` section (run dir and
layout), saved as ``job_config.yaml`` in the run dir so a rank (or a user reading the run
later) needs nothing but that file.
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional

import yaml
from hydra.core.hydra_config import HydraConfig

from hpc_train.config.launcher import launcher_kind
from hpc_train.launch.planning.plan import RunPlan
from hpc_train.launch.planning.validate import check_resume_compatible, code_dirs, normalize_precision, script_cwd
from hpc_train.processes.script_command import is_script_job
from hpc_train.records import rundir


def build_job_spec(plan: RunPlan, choices: Optional[Dict[str, str]] = None) -> Dict[str, Any]:
    """The job spec of a validated plan; `choices` (the config-group options) are read from Hydra when not given."""
    spec = plan.config.plain()
    spec["trainer"]["precision"] = normalize_precision(spec["trainer"]["precision"])
    if plan.parallel.stages is not None:
        spec["strategy"]["stages"] = plan.parallel.stages
    layout = asdict(plan.layout)
    layout["world_size"] = plan.layout.world_size
    layout["data_parallel_size"] = plan.parallel.data_parallel_size
    spec["job"] = {
        "run_dir": str(plan.run_dir.resolve()),
        "layout": layout,
        "choices": dict(choices) if choices is not None else hydra_choices(),
        "code_dirs": code_dirs(),
        "sweep": hydra_sweep(str(plan.config.launcher.name)),
    }
    spec["backend"] = launcher_kind(plan.config.launcher.name).rank_settings()  # how the ranks were started
    if is_script_job(spec):  # the script's folder, fixed where hpc-train was started
        spec["script"]["cwd"] = str(script_cwd(plan.config))
    else:
        check_resume_compatible(spec, plan.run_dir)
    return spec


def hydra_choices() -> Dict[str, str]:
    """The config-group options this job was composed from (model=resnet18, ...): how runs name their model and data."""
    if not HydraConfig.initialized():
        return {}
    return group_choices(HydraConfig.get().runtime.choices)


def group_choices(choices: Mapping[Any, Any]) -> Dict[str, str]:
    """A Hydra config's runtime choices without Hydra's own groups (hydra/launcher, ...) and groups left unchosen."""
    return {str(k): str(v) for k, v in choices.items() if not str(k).startswith("hydra/") and v is not None}


def hydra_sweep(launcher: str) -> Optional[Dict[str, str]]:
    """A sweep's job (Hydra composed it for ``-m``) under `launcher` (launcher.name): its sweep dir and how the sweep's
    jobs that did not complete run again (rundir.RESUME_HINTS: what a job that stops says); None for a run of its
    own."""
    held = HydraConfig.instance().cfg
    if held is None:
        return None
    if _last_sweep[0] is not held or _last_sweep[1] != launcher:  # ~40 us: once per Hydra config, not per job
        hydra, sweep = held.hydra, None
        if str(getattr(hydra.mode, "name", hydra.mode)) == "MULTIRUN":
            rerun = rundir.RERUN_FAILED if launcher_kind(launcher).submits else rundir.RERUN_SWEEP
            sweep = {"dir": str(Path(str(hydra.sweep.dir)).resolve()), "rerun": rerun}
        _last_sweep[:] = [held, launcher, sweep]
    return None if _last_sweep[2] is None else dict(_last_sweep[2])


_last_sweep: List[Any] = [None, None, None]  # hydra_sweep's last: (the Hydra config it read, launcher, its answer)


def write_yaml(data: Any, path: Path) -> Path:
    """Plain data as YAML with libyaml's emitter when present (a 10,000-job sweep writes 10,000 of these)."""
    dumper = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
    path.write_text(yaml.dump(data, Dumper=dumper, sort_keys=False, default_flow_style=False, allow_unicode=True))
    return path


def write_job_spec(spec: Dict[str, Any], run_dir: Path) -> Path:
    run_dir.mkdir(parents=True, exist_ok=True)
    return write_yaml(spec, run_dir / rundir.JOB_CONFIG)
