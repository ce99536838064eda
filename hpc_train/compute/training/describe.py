"""What a run says about itself: the names of its model and data, its opening line, whether it is complete already,
the weight average's figures of the summary."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, Optional, Sequence

from hpc_train.records import rundir

if TYPE_CHECKING:
    from hpc_train.compute.training.settings import TrainingSettings

log = logging.getLogger("hpc_train")


def _named(settings: "TrainingSettings", group: str, node: Any) -> str:
    option = settings.job.choices.get(group)  # the config-group options the job was composed from
    return str(option) if option else str(node["_target_"])


def model_name(settings: "TrainingSettings") -> str:
    """The model's config option (model=resnet18); a model not composed from one: its _target_."""
    return _named(settings, "model", settings.run.model)


def data_name(settings: "TrainingSettings") -> str:
    return _named(settings, "data", settings.data.train)


def already_complete(run_dir: Path, resumed_from_step: Optional[int], step: int, total_steps: int) -> bool:
    done = resumed_from_step is not None and step >= total_steps and (run_dir / rundir.SUMMARY).exists()
    if done:
        log.info("this run is already complete (step %d of %d); %s is left as it is", step, total_steps, rundir.SUMMARY)
    return done


def announce(trainer: Any) -> None:
    """The run's opening line: model, strategy, data, steps and how the global batch is split (`trainer`: the
    Trainer, which imports this module)."""
    ranks, size = trainer.ranks, trainer.strategy.data_parallel_size
    split = f"{size} {'rank' if size == 1 else 'ranks'}"
    if ranks.groups > 1:
        split = f"{ranks.groups} replica groups x {split}"
    log.info(
        "training %s (%s) on %s, %d steps (%s), global batch %d = %s x %d",
        model_name(trainer.settings),
        trainer.settings.strategy.name,
        data_name(trainer.settings),
        trainer.total_steps,
        trainer.epochs.describe(),
        trainer.loop.batch_size,
        split,
        trainer.per_rank_batch,
    )


def ema_summary(ema: Any, last_eval: Optional[Dict[str, Any]], metric_names: Sequence[str]) -> Dict[str, Any]:
    """eval_loss_ema, eval_accuracy_ema (and eval_<metric>_ema) of the last evaluation, with trainer.ema_decay."""
    if ema is None:
        return {}
    last = last_eval or {}
    return {f"eval_{name}_ema": last.get(f"{name}_ema") for name in ["loss", "accuracy", *metric_names]}
