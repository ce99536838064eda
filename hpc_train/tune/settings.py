"""``hydra/sweeper=adaptive``'s keys (``hydra.sweeper.*``), typed and checked before any trial starts.

Each refusal names its key and the fix (ConfigError). The keys, their defaults and meanings are written once, in
:class:`TuneConf` and :class:`SchedulerConf` (the Hydra plugin stores them as the sweeper's config node).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, Dict, Mapping, Optional

from hpc_train.errors import ConfigError
from hpc_train.slurm.slurm_time import limit_minutes

PREFIX = "hydra.sweeper"
DIRECTIONS = ("minimize", "maximize")
SCHEDULERS = ("none", "asha", "hyperband")
CONTROLLERS = ("here", "detached", "slurm")  # where the study's controller runs (hpc_train.tune.placement)


@dataclass
class SchedulerConf:
    """``hydra.sweeper.scheduler``: what stops poor trials early. ``none``: every trial trains its full budget."""

    name: str = "asha"
    resource_key: Optional[str] = "trainer.max_steps"  # what a rung grows; the trial's app reads it
    min_resource: int = 1  # the first rung's budget
    max_resource: Optional[int] = None  # the last rung's (a trial's full budget); required unless name=none
    eta: int = 3  # 1/eta of a rung's trials go on to the next, which is eta times longer


@dataclass
class TuneConf:
    """``hydra.sweeper``: the study."""

    direction: str = "minimize"
    objective: Optional[str] = None  # hpc-train: the summary key (default: the config's `objective`); an app: None
    max_trials: int = 16
    max_concurrent: int = 4  # slots: trials (or promotions) running at once
    max_failures: int = 3  # failed trials the study tolerates; one more stops it
    seed: Optional[int] = None  # the sampler's seed
    sampler: str = "tpe"  # an optuna.samplers name, lowercase without 'Sampler': tpe, random, grid, cmaes, qmc, gp
    scheduler: SchedulerConf = field(default_factory=SchedulerConf)
    poll_s: float = 2.0  # how often the controller looks at its trials
    params: Optional[Dict[str, str]] = None  # search space in Hydra's sweep syntax, beside the command line's
    controller: str = "here"  # here (this command), detached (a background process) or slurm (a Slurm job of its own)
    controller_time: str = "24:00:00"  # controller=slurm: its job's time limit (minutes or a Slurm duration)


@dataclass(frozen=True)
class SchedulerSettings:
    name: str
    resource_key: Optional[str]
    min_resource: int
    max_resource: Optional[int]
    eta: int


@dataclass(frozen=True)
class TuneSettings:
    direction: str
    objective: Optional[str]
    max_trials: int
    max_concurrent: int
    max_failures: int
    seed: Optional[int]
    sampler: str
    scheduler: SchedulerSettings
    poll_s: float
    params: Mapping[str, str]
    # where the controller runs: not the study's (a study started here may go on detached), so not in its repr, which
    # the journal holds to refuse a rerun with other settings
    controller: str = field(default="here", repr=False, compare=False)
    controller_minutes: int = field(default=1440, repr=False, compare=False)


def tune_settings(node: Mapping[str, Any]) -> TuneSettings:
    """The sweeper's config node, typed and checked (ConfigError naming the key and the fix)."""
    scheduler = _scheduler(node.get("scheduler") or {})
    settings = TuneSettings(
        direction=str(node.get("direction", "minimize")),
        objective=node.get("objective"),
        max_trials=int(node.get("max_trials", TuneConf.max_trials)),
        max_concurrent=int(node.get("max_concurrent", TuneConf.max_concurrent)),
        max_failures=int(node.get("max_failures", TuneConf.max_failures)),
        seed=None if node.get("seed") is None else int(node["seed"]),
        sampler=str(node.get("sampler", TuneConf.sampler)),
        scheduler=scheduler,
        poll_s=float(node.get("poll_s", TuneConf.poll_s)),
        params=dict(node.get("params") or {}),
        controller=str(node.get("controller", TuneConf.controller)),
        controller_minutes=_minutes(node.get("controller_time", TuneConf.controller_time)),
    )
    _check_study(settings)
    return settings


def _scheduler(node: Mapping[str, Any]) -> SchedulerSettings:
    defaults = {f.name: f.default for f in fields(SchedulerConf)}
    values = {name: node.get(name, default) for name, default in defaults.items()}
    settings = SchedulerSettings(
        name=str(values["name"]),
        resource_key=None if values["resource_key"] is None else str(values["resource_key"]),
        min_resource=int(values["min_resource"]),
        max_resource=None if values["max_resource"] is None else int(values["max_resource"]),
        eta=int(values["eta"]),
    )
    _check_scheduler(settings)
    return settings


def _check_scheduler(s: SchedulerSettings) -> None:
    key = f"{PREFIX}.scheduler"
    if s.name not in SCHEDULERS:
        raise ConfigError(f"{key}.name", f"{s.name!r} is no scheduler.", f"pick one of {', '.join(SCHEDULERS)}.")
    if s.name == "none":
        return
    if not s.resource_key:
        raise ConfigError(
            f"{key}.resource_key",
            f"scheduler {s.name} grows a budget from rung to rung and needs the key that sets it.",
            f"set {key}.resource_key to the key your run reads as its length, e.g. trainer.max_steps.",
        )
    if s.max_resource is None:
        raise ConfigError(
            f"{key}.max_resource", "a trial's full budget is not set.", f"set {key}.max_resource, e.g. =81."
        )
    if s.min_resource < 1 or s.min_resource > s.max_resource:
        raise ConfigError(
            f"{key}.min_resource",
            f"min_resource={s.min_resource} must be at least 1 and at most max_resource={s.max_resource}.",
            f"lower {key}.min_resource or raise {key}.max_resource.",
        )
    if s.eta < 2:
        raise ConfigError(f"{key}.eta", f"eta={s.eta} keeps every trial at every rung.", f"set {key}.eta=3 (or 2).")


def _minutes(value: Any) -> int:
    try:
        return limit_minutes(value)
    except ValueError:
        raise ConfigError(
            f"{PREFIX}.controller_time",
            f"{value!r} is not a positive Slurm time.",
            f"use minutes or HH:MM:SS, e.g. {PREFIX}.controller_time=48:00:00.",
        ) from None


def _check_study(s: TuneSettings) -> None:
    if s.controller not in CONTROLLERS:
        raise ConfigError(
            f"{PREFIX}.controller",
            f"{s.controller!r} is no place for the study's controller.",
            f"pick one of {', '.join(CONTROLLERS)}.",
        )
    if s.direction not in DIRECTIONS:
        raise ConfigError(f"{PREFIX}.direction", f"{s.direction!r} is no direction.", "minimize or maximize.")
    for name in ("max_trials", "max_concurrent"):
        if getattr(s, name) < 1:
            raise ConfigError(f"{PREFIX}.{name}", f"{name}={getattr(s, name)} runs nothing.", f"set {name} >= 1.")
    if s.max_failures < 0:
        raise ConfigError(f"{PREFIX}.max_failures", "a count cannot be negative.", "set max_failures >= 0.")
    if s.poll_s <= 0:
        raise ConfigError(f"{PREFIX}.poll_s", f"poll_s={s.poll_s} is no interval.", "set poll_s to seconds > 0.")
