"""``hydra/sweeper=adaptive``: the Hydra sweeper whose ``sweep()`` is the adaptive study's controller.

Registered by hydra_plugins.hpc_train_launcher (its keys: hpc_train.tune.settings.TuneConf). Before any trial starts,
it reads the sweeper's keys and the search space, composes the job config of the trials' fixed part, and refuses
(ConfigError, nothing started) a dry run, a resource key the job does not have or that is swept, and an objective the
run does not report. Then the controller (hpc_train.tune.controller) runs the study in the sweep dir. Optuna is
imported here only once a sweep starts (the plugin scan of every Hydra command stays light).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, List, Optional

from hydra.plugins.sweeper import Sweeper
from omegaconf import DictConfig, OmegaConf

from hpc_train.errors import ConfigError
from hpc_train.records.rundir import write_text_atomic
from hpc_train.tune.settings import PREFIX, TuneSettings, tune_settings

log = logging.getLogger("hpc_train")
RESULTS = "optimization_results.yaml"  # in the sweep dir, as Hydra's Optuna sweeper writes it: the best trial
_MISSING = object()


class AdaptiveSweeper(Sweeper):
    def __init__(self, **conf: Any) -> None:
        self.conf = conf
        self.config: Optional[DictConfig] = None
        self.hydra_context: Any = None

    def setup(self, *, hydra_context: Any, task_function: Any, config: DictConfig) -> None:
        self.hydra_context, self.config = hydra_context, config

    def sweep(self, arguments: List[str]) -> Any:
        # the study's parts (Optuna): only a sweep that starts imports them
        from hpc_train.launch.planning.objective import read_objective
        from hpc_train.tune.controller import Controller
        from hpc_train.tune.space import search_space
        from hpc_train.tune.trials import HpcTrainTrials

        assert self.config is not None
        settings = tune_settings(OmegaConf.to_container(OmegaConf.create(self.conf), resolve=True))  # type: ignore
        space = search_space(arguments, settings.params)
        job = self.hydra_context.config_loader.load_sweep_config(self.config, list(space.fixed))
        objective = _check_job(job, settings, space.distributions)
        sweep_dir = Path(str(self.config.hydra.sweep.dir))
        trials = HpcTrainTrials(str(job.launcher.name), _config_dir(self.config))

        def value_of(look: Any, run_dir: Path) -> float:
            return read_objective(run_dir, objective)

        best = Controller(settings, space, trials, sweep_dir, value_of).run()
        write_text_atomic(sweep_dir / RESULTS, OmegaConf.to_yaml(OmegaConf.create({"best": best})))
        print(f"hpc-train: study done: best trial {best['number']}, {objective} = {best['value']:g}, {best['params']}")
        return best


def _check_job(job: DictConfig, settings: TuneSettings, swept: Any) -> str:
    """The objective key the trials report; ConfigError for what cannot be swept adaptively."""
    from hpc_train.launch.planning.objective import check_objective  # hpc-train's objective keys (login side)

    objective = settings.objective or job.get("objective")
    if job.get("dry_run"):
        raise ConfigError(
            "dry_run",
            "an adaptive sweep trains its trials to rank them; a dry run trains nothing.",
            "drop dry_run=true (or see the layouts with the default sweeper: hpc-train -m ... dry_run=true).",
        )
    key = settings.scheduler.resource_key
    if key and settings.scheduler.name != "none":
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
    for source in config.hydra.runtime.config_sources:
        if source.provider == "command-line" and str(source.path).startswith("file://"):
            return str(source.path)[len("file://") :]
    return None
