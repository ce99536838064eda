"""``hydra/sweeper=adaptive``: the Hydra sweeper whose ``sweep()`` is the adaptive study's controller.

Registered by hydra_plugins.hpc_train_launcher (its keys: hpc_train.tune.settings.TuneConf). Before any trial starts,
it reads the sweeper's keys and the search space, composes the job config of the trials' fixed part, and refuses
(ConfigError, nothing started) a dry run, a resource key the job does not have or that is swept, an objective the
run does not report, and a cosine LR schedule another resource key than trainer.max_steps would change; with
trainer.max_steps, every rung's schedule spans the full budget (trainer.lr_schedule_steps). Then the controller
(hpc_train.tune.controller) runs the study in the sweep dir. Optuna is imported here only once a sweep starts (the
plugin scan of every Hydra command stays light).
"""

from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path
from typing import Any, List, Optional, Tuple

from hydra.plugins.sweeper import Sweeper
from omegaconf import DictConfig, OmegaConf, open_dict

from hpc_train.errors import ConfigError
from hpc_train.records.rundir import write_text_atomic
from hpc_train.tune.settings import PREFIX, TuneSettings, tune_settings

log = logging.getLogger("hpc_train")
# hpc-train's own Hydra launcher, which only hpc-train's config picks: a sweep with it sweeps hpc-train jobs
OWN_LAUNCHER = "hydra_plugins.hpc_train_launcher.HpcTrainLauncher"
RESULTS = "optimization_results.yaml"  # in the sweep dir, as Hydra's Optuna sweeper writes it: the best trial
_MISSING = object()


class AdaptiveSweeper(Sweeper):
    def __init__(self, **conf: Any) -> None:
        self.conf = conf
        self.config: Optional[DictConfig] = None
        self.hydra_context: Any = None
        self.task_function: Any = None

    def setup(self, *, hydra_context: Any, task_function: Any, config: DictConfig) -> None:
        self.hydra_context, self.task_function, self.config = hydra_context, task_function, config

    def sweep(self, arguments: List[str]) -> Any:
        """The study, run here or started where hydra.sweeper.controller says. A Hydra app's study refused before
        anything runs ends with its one message and the refusal's exit code, as the app's own launcher refuses (an
        app has no hpc-train command line to say it); hpc-train's says it as any of its refusals."""
        assert self.config is not None
        try:
            return self._sweep(arguments)
        except ConfigError as err:
            if OmegaConf.select(self.config, "hydra.launcher._target_") == OWN_LAUNCHER:
                raise
            from hpc_train.launch.hydra.app_launcher import refuse  # only a refused app study needs it

            refuse(Path(str(self.config.hydra.sweep.dir)), err)

    def _sweep(self, arguments: List[str]) -> Any:
        # the study's parts (Optuna, the controller's placement): only a sweep that starts imports them
        from hpc_train.tune.controller import Controller
        from hpc_train.tune.packed_trials import packed_trials
        from hpc_train.tune.placement import Placement
        from hpc_train.tune.space import search_space

        assert self.config is not None
        settings = tune_settings(OmegaConf.to_container(OmegaConf.create(self.conf), resolve=True))  # type: ignore
        place = Placement(Path(str(self.config.hydra.sweep.dir)), settings)  # a live controller of the study refused
        space = search_space(arguments, settings.params)
        job = self.hydra_context.config_loader.load_sweep_config(self.config, list(space.fixed))
        _check_resource(job, settings, space.distributions)
        sweep_dir = Path(str(self.config.hydra.sweep.dir))
        if OmegaConf.select(self.config, "hydra.launcher._target_") == OWN_LAUNCHER:
            objective = _check_objective(job, settings)
            space = replace(space, fixed=[*space.fixed, *_schedule_overrides(job, settings)])
            place.forward(job, self.config.hydra)  # cluster.login: the cluster's hpc-train runs it (raises Forwarded)
            trials, value_of = _hpc_train_trials(job, self.config, objective)
            trials = packed_trials(job, self.hydra_context.config_loader, self.config, space.fixed) or trials
            _check_resumable(job, trials)
        else:
            objective = "the reported objective"
            trials, value_of = self._app_trials(sweep_dir, space.fixed)
        if place.start_elsewhere(job):  # controller=detached or slurm: started there and said; this command returns
            return None
        with place.held():
            best = Controller(settings, space, trials, sweep_dir, value_of).run()
            trials.close()
        write_text_atomic(sweep_dir / RESULTS, OmegaConf.to_yaml(OmegaConf.create({"best": best})))
        print(f"hpc-train: study done: best trial {best['number']}, {objective} = {best['value']:g}, {best['params']}")
        return best

    def _app_trials(self, sweep_dir: Path, fixed: List[str]) -> Tuple[Any, Any]:
        """A Hydra app's trials: its own Hydra launcher (hpc_train's), told not to wait, starts each rung; with
        hydra.launcher.pack set, each rung is fed into the study's packed allocations instead (as hpc-train's)."""
        # a Hydra app's rungs: run by its launcher (Hydra's plugins), the trials' records read through the report
        from hydra.core.plugins import Plugins

        from hpc_train.tune.app_packed import app_packed_trials
        from hpc_train.tune.app_trials import AppTrials, reported_value

        assert self.config is not None
        with open_dict(self.config):
            if "wait" in self.config.hydra.launcher:
                self.config.hydra.launcher.wait = False
        launcher = Plugins.instance().instantiate_launcher(
            hydra_context=self.hydra_context, task_function=self.task_function, config=self.config
        )
        return app_packed_trials(launcher, sweep_dir, fixed) or AppTrials(launcher, sweep_dir), reported_value


def _hpc_train_trials(job: DictConfig, config: DictConfig, objective: str) -> Tuple[Any, Any]:
    """hpc-train's trials: each rung an hpc-train job through the API; its objective the summary's key."""
    # hpc-train's rungs: through the API (a child hpc-train per rung)
    from hpc_train.launch.planning.objective import read_objective
    from hpc_train.tune.trials import HpcTrainTrials

    def value_of(run_dir: Path) -> float:
        return read_objective(run_dir, objective)

    return HpcTrainTrials(str(job.launcher.name), _config_dir(config), objective, _resumes(job)), value_of


def _resumes(job: DictConfig) -> bool:
    """False for a script job without script.resume_args: a next rung could not resume the last (it would start the
    script over), so its trials take the scheduler's stopping form (each its full budget in one job, stopped at a
    rung)."""
    script = job.get("script") or {}
    return script.get("argv") is None or bool(script.get("resume_args"))


def _check_resumable(job: DictConfig, trials: Any) -> None:
    """A script job that cannot resume, with trials that only pause and promote (packed ones), refused: each promoted
    rung would start the script over."""
    if not _resumes(job) and getattr(trials, "resumes", True):
        raise ConfigError(
            "script.resume_args",
            "a packed adaptive study pauses each trial at a rung and resumes it in a later one, which a script job"
            " without script.resume_args cannot do (a promoted rung would start the script over).",
            "set script.resume_args to the arguments that make the script resume (see the own-script guide), or drop"
            " launcher.pack.*: with one job per trial, a trial that cannot resume is stopped at a rung instead.",
        )


def _check_resource(job: DictConfig, settings: TuneSettings, swept: Any) -> None:
    """A dry run, and a resource key the job does not have or that is swept, refused (ConfigError)."""
    if job.get("dry_run"):
        raise ConfigError(
            "dry_run",
            "an adaptive sweep trains its trials to rank them; a dry run trains nothing.",
            "drop dry_run=true (or see the layouts with the default sweeper: hpc-train -m ... dry_run=true).",
        )
    key = settings.scheduler.resource_key
    if not key or settings.scheduler.name == "none":
        return
    if OmegaConf.select(job, key, default=_MISSING) is _MISSING:
        raise ConfigError(
            f"{PREFIX}.scheduler.resource_key",
            f"{key} is no key of the job's config, so the rungs would not change what the trials train.",
            "name the key the run reads as its length, e.g. trainer.max_steps or trainer.epochs.",
        )
    if any(name.lstrip("+~") == key for name in swept):
        raise ConfigError(
            f"{PREFIX}.scheduler.resource_key",
            f"{key} is swept, but the scheduler sets it rung by rung.",
            f"take {key} out of the search space.",
        )


def _schedule_overrides(job: DictConfig, settings: TuneSettings) -> List[str]:
    """hpc-train's LR schedule kept from rung to rung: with trainer.max_steps as the resource, every rung's schedule
    spans max_resource (trainer.lr_schedule_steps, unless the user set it), so that a promoted trial trains as an
    uninterrupted run does; with another resource key, a cosine schedule whose length the rung would change is refused
    (ConfigError), unless trainer.lr_schedule_steps is set."""
    from hpc_train.processes.script_command import is_script_job  # login side, no torch

    s = settings.scheduler
    trainer = job.get("trainer") or {}
    if s.name == "none" or is_script_job(job) or trainer.get("lr_schedule_steps") is not None:
        return []
    if s.resource_key == "trainer.max_steps":
        return [f"++trainer.lr_schedule_steps={s.max_resource}"]
    if trainer.get("lr_schedule") == "cosine":
        raise ConfigError(
            "trainer.lr_schedule_steps",
            f"trainer.lr_schedule=cosine decays over the run's length, which {s.resource_key} changes from rung to"
            " rung: a promoted trial would not train as an uninterrupted run.",
            f"set trainer.lr_schedule_steps to the steps of the full budget ({s.resource_key}={s.max_resource}), use"
            " trainer.lr_schedule=constant or step, or sweep with scheduler.resource_key=trainer.max_steps.",
        )
    return []


def _check_objective(job: DictConfig, settings: TuneSettings) -> str:
    """hpc-train's objective key, checked as every sweep's is, and one an evaluation must report with none."""
    from hpc_train.launch.planning.objective import check_objective  # hpc-train's objective keys (login side)

    objective = settings.objective or job.get("objective")
    OmegaConf.set_struct(job, False)
    job.objective = objective
    check_objective(job)
    if str(objective).startswith("eval_") and not OmegaConf.select(job, "trainer.eval", default=True):
        raise ConfigError(
            "objective",
            f"{objective} comes from evaluation, and trainer.eval=false evaluates nothing: no rung would report it.",
            "set trainer.eval=true, or sweep on a training metric (objective=train_loss).",
        )
    return str(objective)


def _config_dir(config: DictConfig) -> Optional[str]:
    """The --config-dir of the command line (the trials search the same config groups)."""
    for source in config.hydra.runtime.config_sources:  # Hydra keeps the scheme apart: path /x, schema file
        if source.provider == "command-line" and source.schema == "file":
            return str(source.path)
    return None
