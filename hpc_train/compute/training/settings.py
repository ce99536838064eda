"""What a training rank is configured by: the job spec's sections, typed, as the parts of the trainer read them.

The rank's entry (hpc_train.compute.entry.train) reads them once from the completed job spec; the
trainer then hands each part its own section: the strategy its strategy's, the checkpointer the
checkpointing's, the trackers the logger's. The trainer's own keys are split by the part reading
them: the loop's (:class:`TrainerSettings`), optimisation's (training.optim), checkpointing's and the
watchdog's (checkpointing.checkpointer, runtime.heartbeat).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, Mapping, Optional

from hpc_train.compute.checkpointing.checkpointer import CheckpointSettings
from hpc_train.compute.data.loaders import DataSettings
from hpc_train.compute.parallel.base import StrategySettings
from hpc_train.compute.performance.settings import ProfileSettings
from hpc_train.compute.replicas.settings import ReplicaSettings
from hpc_train.compute.runtime.heartbeat import WatchdogSettings
from hpc_train.compute.runtime.interrupts import LauncherSettings
from hpc_train.compute.settings import BackendSettings, JobSettings
from hpc_train.compute.training.optim import OptimSettings
from hpc_train.compute.training.tracker_common import LoggerSettings
from hpc_train.contracts.job_layout import JobLayout


@dataclass(frozen=True)
class RunSettings:
    """The top-level keys a rank reads: the seed, what to resume from, and the model's ``_target_`` node."""

    seed: int
    resume: str  # auto | never | a path (hpc_train.compute.checkpointing.checkpointer)
    model: Mapping[str, Any]


@dataclass(frozen=True)
class TrainerSettings:
    """The trainer keys of the loop: the batch and the run's length, the user's loss and step, precision and
    compilation, evaluation, logging and progress."""

    batch_size: int  # the global batch of one optimizer step
    epochs: Optional[int]
    max_steps: Optional[int]
    loss: Mapping[str, Any]  # a _target_ node
    step: Optional[Mapping[str, Any]]  # a _target_ node; None: the built-in step of the loss
    precision: str
    channels_last: bool
    activation_checkpointing: str
    compile: bool
    eval: bool
    eval_every: Optional[int]  # None: after every epoch
    eval_batches: Optional[int]  # None: the whole validation set
    log_every: int
    throughput_warmup_steps: int
    progress: bool
    profile: ProfileSettings


@dataclass(frozen=True)
class TrainingSettings:
    """Every section a training rank reads. `job_spec` is the spec itself as plain data, read for no setting: the
    checkpoint's fingerprint and the trackers record it."""

    run: RunSettings
    job: JobSettings  # its layout settled on the allocation (and a replica group's is its group's)
    planned_layout: JobLayout  # the layout as submitted: what the allocation is checked against
    replicas: Optional[ReplicaSettings]  # None: no replica groups (fault_tolerance)
    trainer: TrainerSettings
    optim: OptimSettings
    checkpointing: CheckpointSettings
    watchdog: WatchdogSettings
    strategy: StrategySettings  # the subclass its strategy reads (Strategy.settings_type)
    data: DataSettings
    logger: Optional[LoggerSettings]  # None: the spec has no logger node (metrics.jsonl only)
    launcher: LauncherSettings
    backend: BackendSettings
    peak_tflops: Optional[Mapping[str, float]]  # cluster.gpu_peak_tflops: the device's dense peak per precision
    job_spec: Dict[str, Any]
