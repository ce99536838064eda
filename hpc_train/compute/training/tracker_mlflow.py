"""logger=mlflow: rank 0's records as the metrics of an MLflow run, the flattened config as its params.

The store: ``logger.tracking_uri``, by default one SQLite file per job, ``sqlite:///<run dir>/mlflow.db``.
A sweep's jobs run at the same time, often on a shared file system (Lustre, NFS), where many
writers to one SQLite file is a known way to lose data; one file per job has one writer. A
tracking server (``logger.tracking_uri=http://host:5000``) gathers a whole sweep in one store.

Names: ``train_loss``, ``train_lr``, ``eval_loss``, ``eval_accuracy``, ... (``<kind>_<key>``, as in
summary.json), each at its step; params ``trainer.lr``, ``strategy.name``, ... (the resolved config).
A resumed attempt continues the run whose id it kept in ``<run dir>/mlflow_run.json``: it logs
no metric at a step where the run has one already (the lost attempt logged it past the checkpoint,
and the resumed one repeats that step bit-identically), so each metric's history holds one value
per step, as metrics.jsonl does.
"""

from __future__ import annotations

import json
import logging
import os
import re
import time
from pathlib import Path
from typing import Any, Dict, Iterator, List, Mapping, Optional, Set, Tuple

from mlflow.entities import Metric, Param
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient
from omegaconf import OmegaConf

from hpc_train.compute.training.tracker_common import (
    LoggerSettings,
    read_run_file,
    resumed_attempt,
    run_label,
    scalars,
    write_run_file,
)

RUN_FILE = "mlflow_run.json"
STORE = "mlflow.db"  # the default store's file in the run dir
ARTIFACTS = "mlartifacts"  # the default store's artifact folder in the run dir
DEFAULT_EXPERIMENT = "Default"  # MLflow's own, where logger.experiment=null puts the run
MAX_PARAMS = 100  # per log_batch call (MLflow's limit)
MAX_METRICS = 1000
MAX_KEY, MAX_VALUE = 250, 6000  # MLflow's limits on a param's name and value

log = logging.getLogger("hpc_train")


def default_uri(run_dir: Path) -> str:
    return f"sqlite:///{Path(run_dir).absolute() / STORE}"


def flat_params(config: Any, prefix: str = "") -> Iterator[Tuple[str, str]]:
    """("trainer.lr", "0.1"), ...: every leaf of the config; lists and nulls as JSON, strings as they are."""
    if isinstance(config, dict):
        for key, value in config.items():
            yield from flat_params(value, f"{prefix}.{key}" if prefix else str(key))
        return
    text = config if isinstance(config, str) else json.dumps(config)
    name = re.sub(r"[^\w\-. /]", "_", prefix)[:MAX_KEY]  # the characters MLflow takes in a name
    yield name, text if len(text) <= MAX_VALUE else text[: MAX_VALUE - 3] + "..."


class MlflowTracker:
    def __init__(
        self, settings: LoggerSettings, run_dir: Path, config: Mapping[str, Any], continues: bool = False
    ) -> None:
        """`config`: the job spec as plain data, flattened into the run's params; `continues`: a restarted replica
        group 0, which continues the run it opened before its failure, as a resumed attempt does."""
        # connected here, before training starts: creating an SQLite store takes a second or two
        self.run_dir = Path(run_dir)
        own_store = settings.tracking_uri is None  # null: an SQLite store in the run dir
        self.uri = default_uri(self.run_dir) if own_store else str(settings.tracking_uri)
        self.client = MlflowClient(tracking_uri=self.uri)
        self.run_name = run_label(self.run_dir) if settings.run_name is None else str(settings.run_name)
        self.log_model = bool(settings.log_model)
        self.params = dict(flat_params(dict(config)))
        name = DEFAULT_EXPERIMENT if settings.experiment is None else str(settings.experiment)
        experiment = self.client.get_experiment_by_name(name)
        if experiment is None:
            location = (self.run_dir.absolute() / ARTIFACTS).as_uri() if own_store else None
            try:
                self.experiment_id = self.client.create_experiment(name, artifact_location=location)
            except MlflowException:  # another job of the sweep created it first (a shared tracking server)
                self.experiment_id = self.client.get_experiment_by_name(name).experiment_id
        else:
            self.experiment_id = experiment.experiment_id
        self.run_id: Optional[str] = None
        self.closed = False
        self.continues = continues
        self._logged: Set[Tuple[str, int]] = set()  # (metric, step) the run had when this attempt continued it

    # -- the run ------------------------------------------------------------------------------
    def _kept_run(self) -> Optional[Any]:
        """The run this attempt continues: the one in mlflow_run.json, if this attempt resumed (or this is a restarted
        group 0) and the store has it."""
        if not self.continues and not resumed_attempt(self.run_dir):
            return None
        kept = read_run_file(self.run_dir / RUN_FILE)
        if not kept or kept.get("tracking_uri") != self.uri or not kept.get("run_id"):
            return None
        try:
            return self.client.get_run(str(kept["run_id"]))
        except MlflowException:
            return None

    def _start(self) -> None:
        run = self._kept_run()
        if run is not None:
            self.run_id = run.info.run_id
            self.client.update_run(self.run_id, status="RUNNING")
            for key in run.data.metrics:
                self._logged.update((key, m.step) for m in self.client.get_metric_history(self.run_id, key))
            have = run.data.params
        else:
            run = self.client.create_run(self.experiment_id, run_name=self.run_name, tags=self._tags())
            self.run_id, have = run.info.run_id, {}
            write_run_file(
                self.run_dir / RUN_FILE,
                {"tracking_uri": self.uri, "experiment_id": self.experiment_id, "run_id": self.run_id},
            )
        changed = sorted(k for k, v in self.params.items() if k in have and have[k] != v)
        if changed:  # MLflow keeps a param's first value
            log.warning("MLflow run %s keeps its earlier value of %s", self.run_id, ", ".join(changed))
        new = [Param(k, v) for k, v in self.params.items() if k not in have]
        for i in range(0, len(new), MAX_PARAMS):
            self.client.log_batch(self.run_id, params=new[i : i + MAX_PARAMS])
        log.info("MLflow run %s %s in %s", self.run_id, "continued" if have else "started", self.uri)

    def _tags(self) -> Dict[str, str]:
        tags = {"hpc_train.run_dir": str(self.run_dir.absolute())}
        if os.environ.get("SLURM_JOB_ID"):
            tags["hpc_train.slurm_job_id"] = os.environ["SLURM_JOB_ID"]
        overrides = self.run_dir / ".hydra" / "overrides.yaml"
        if overrides.is_file():  # what sets this job apart in a sweep
            listed = OmegaConf.load(overrides)
            tags["hpc_train.overrides"] = " ".join(str(o) for o in listed)[:MAX_VALUE]
        return tags

    # -- the writer's calls ---------------------------------------------------------------------
    def write(self, record: Dict[str, Any]) -> None:
        if self.run_id is None:
            self._start()
        step, kind = int(record["step"]), record["kind"]
        stamp = int(1000 * float(record.get("time") or time.time()))
        metrics: List[Any] = [
            Metric(f"{kind}_{key}", value, stamp, step)
            for key, value in scalars(record)
            if (f"{kind}_{key}", step) not in self._logged
        ]
        for i in range(0, len(metrics), MAX_METRICS):
            self.client.log_batch(self.run_id, metrics=metrics[i : i + MAX_METRICS])

    def flush(self) -> None:
        """Nothing to do: each log_batch is in the store (the SQLite file, or the tracking server) when it returns."""

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        if self.run_id is None:
            self._start()  # a run that logged no metric still shows its params (and model)
        if self.log_model:
            for path in sorted(self.run_dir.glob("model*.pt")):  # model.pt, or model_stage<s>.pt of engine=pipelining
                self.client.log_artifact(self.run_id, str(path))
        self.client.set_terminated(self.run_id, "FINISHED")
        hint = f"mlflow ui --backend-store-uri {self.uri}" if self.uri.startswith("sqlite:") else self.uri
        log.info("MLflow run %s finished; browse it with: %s", self.run_id, hint)
