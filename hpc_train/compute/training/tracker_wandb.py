"""logger=wandb: rank 0's records in a Weights & Biases run, offline by default on Slurm.

Compute nodes of most national clusters have no internet, so on Slurm (a launcher whose ranks run in
a Slurm job, the job spec's ``backend.slurm_job``, or any run inside a Slurm allocation) the run is
written offline unless ``logger.mode`` or ``$WANDB_MODE`` says otherwise; at the end rank 0 logs the
``wandb sync`` command that uploads it from a machine with internet (the login node). Each attempt
of a requeued or rerun job writes its own ``offline-run-<time>-<id>`` folder under the same run id
(kept in ``<run dir>/wandb_run.json``, passed with ``resume="allow"``); ``wandb sync`` uploads them
in order of start time, and W&B keeps the first value logged at a step (it drops rows at steps a run
already has: a resumed attempt repeats, bit-identically, the steps the lost one logged past its
checkpoint).

W&B has no call that writes its file at once: :meth:`WandbTracker.flush` (before every checkpoint
and at the stop signal) commits the step W&B holds open, then waits for W&B's next periodic write.
"""

from __future__ import annotations

import logging
import os
import secrets
import string
import time
from pathlib import Path
from typing import Any, Dict, Mapping, Optional

from hpc_train.compute.runtime.refusal import Refusal
from hpc_train.compute.training.tracker_common import (
    LoggerSettings,
    in_run_dir,
    read_run_file,
    resumed_attempt,
    run_label,
    scalars,
    write_run_file,
)

RUN_FILE = "wandb_run.json"
# W&B writes its .wandb file every 15 s by default: a kill -9 (node failure, OOM) would lose up to 15 s of
# rows, and each flush before a checkpoint would wait as long.
# Every 2 s instead, unless $WANDB__TRANSACTION_LOG_FLUSH_INTERVAL says otherwise (a private setting of wandb
# 0.31: left alone by a wandb that has no such setting).
FLUSH_SETTING, FLUSH_S = "x_transaction_log_flush_interval", 2.0
# A flush waits one such interval after its commit, and this much longer for the commit to reach W&B's service.
REACH_S = 0.3

log = logging.getLogger("hpc_train")


def wandb_mode(configured: Optional[str], slurm_job: bool) -> Optional[str]:
    """logger.mode if set, else $WANDB_MODE (None: wandb reads it), else offline on Slurm (`slurm_job`: the launcher
    runs the ranks in a Slurm job; or this process is inside a Slurm allocation), else W&B's default."""
    if configured:
        return str(configured)
    if os.environ.get("WANDB_MODE"):
        return None
    if slurm_job or os.environ.get("SLURM_JOB_ID"):
        return "offline"
    return None


def text_or_none(value: Any) -> Optional[str]:
    return None if value is None else str(value)  # logger.project=2024 reaches here as an int


def new_run_id() -> str:
    """8 random lowercase letters and digits, as W&B's own ids."""
    return "".join(secrets.choice(string.ascii_lowercase + string.digits) for _ in range(8))


class WandbTracker:
    def __init__(
        self,
        settings: LoggerSettings,
        run_dir: Path,
        config: Mapping[str, Any],
        slurm_job: bool,
        continues: bool = False,
    ) -> None:
        """`config`: the job spec as plain data (the run's config in W&B); `slurm_job`: the job spec's
        ``backend.slurm_job`` (offline by default, :func:`wandb_mode`); `continues`: a restarted replica group 0,
        which continues the run it opened before its failure, as a resumed attempt does."""
        import wandb  # here, before training starts (about 0.3 s), rather than at the first logged step

        self._wandb = wandb
        self.run_dir = Path(run_dir)
        self.dir = self.run_dir if settings.dir is None else in_run_dir(settings.dir, self.run_dir)
        self.mode = wandb_mode(settings.mode, slurm_job)
        self.init_args: Dict[str, Any] = {
            "project": text_or_none(settings.project),
            "entity": text_or_none(settings.entity),
            "name": run_label(self.run_dir) if settings.run_name is None else str(settings.run_name),
            "tags": [str(t) for t in settings.tags] if settings.tags else None,
            "config": dict(config),
        }
        self._run: Optional[Any] = None
        self._open_step: Optional[int] = None  # the step of the rows logged since the last flush
        self.continues = continues

    def _start(self) -> None:
        path = self.run_dir / RUN_FILE
        kept = read_run_file(path) if self.continues or resumed_attempt(self.run_dir) else None
        run_id = str(kept["id"]) if kept and kept.get("id") else new_run_id()
        write_run_file(path, {"id": run_id, "project": self.init_args["project"], "dir": str(self.dir)})
        self.dir.mkdir(parents=True, exist_ok=True)
        try:
            self._run = self._wandb.init(
                id=run_id,
                resume="allow",
                dir=str(self.dir),
                mode=self.mode,
                settings=self._settings(),
                **self.init_args,
            )
        except self._wandb.errors.UsageError as err:  # no API key, most often: online mode needs `wandb login`
            raise Refusal(
                f"logger=wandb could not start its run ({err}): run `wandb login` in this environment, or log offline"
                " with logger.mode=offline and upload later with `wandb sync`"
            ) from err
        mode = self._run.settings.mode
        log.info("W&B run %s %s (%s mode) in %s", run_id, "continued" if kept else "started", mode, self.dir)

    def _settings(self) -> Optional[Any]:
        settings = self._wandb.Settings
        if FLUSH_SETTING not in getattr(settings, "model_fields", {}):
            return None
        if "WANDB__TRANSACTION_LOG_FLUSH_INTERVAL" in os.environ:
            return None
        return settings(**{FLUSH_SETTING: FLUSH_S})

    def write(self, record: Dict[str, Any]) -> None:
        if self._run is None:
            self._start()
        kind, self._open_step = record["kind"], int(record["step"])
        self._run.log({f"{kind}/{key}": value for key, value in scalars(record)}, step=self._open_step)

    def flush(self) -> None:
        """Commit the open step (W&B commits a step only when the next one is logged), then wait until W&B's service
        process has written its file (every FLUSH_SETTING seconds): a kill -9 after this loses no row logged before.
        The caller logs nothing more at that step (W&B drops rows logged at a committed step)."""
        if self._run is None or self._open_step is None:
            return
        self._run.log({}, step=self._open_step, commit=True)
        self._open_step = None
        interval = getattr(self._run.settings, FLUSH_SETTING, None)
        if interval:  # 0 or a wandb without the setting: written when its buffer fills or the run finishes
            time.sleep(float(interval) + REACH_S)

    def close(self) -> None:
        run, self._run = self._run, None
        if run is None:
            return
        offline = run.settings.mode in ("offline", "dryrun")
        folders = Path(run.settings.sync_dir).parent / f"offline-run-*-{run.id}" if offline else None
        run.finish()
        if offline:
            log.info(
                "W&B run %s was written offline; upload it from a machine with internet (the login node):"
                " wandb sync %s",
                run.id,
                folders,
            )
