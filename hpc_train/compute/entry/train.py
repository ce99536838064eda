"""The training entry point every launcher calls in every rank: local workers, Slurm tasks, sbatch scripts."""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import sys
import traceback
from dataclasses import replace
from pathlib import Path
from typing import Any, Dict, List, Optional

from omegaconf import DictConfig, OmegaConf

from hpc_train.compute.entry.script_job import ScriptFailed, run_script
from hpc_train.compute.replicas.settings import replica_settings
from hpc_train.compute.runtime.allocation import allocation_mismatch, settle_layout
from hpc_train.compute.runtime.garbage import release_before_teardown
from hpc_train.compute.runtime.interrupts import TrainingInterrupted
from hpc_train.compute.runtime.ranks import RankInfo, detect_ranks
from hpc_train.compute.runtime.refusal import REFUSALS, Refusal
from hpc_train.compute.runtime.runlog import setup_logging
from hpc_train.compute.settings import JobSettings, backend_section, section
from hpc_train.config.strategy import strategy_id
from hpc_train.containers.inside import image_record
from hpc_train.contracts.job_layout import group_layout
from hpc_train.processes.rank_env import LIGHTHOUSE_VARIABLE
from hpc_train.processes.script_command import is_script_job
from hpc_train.processes.signal_relay import handling
from hpc_train.records import run_claim
from hpc_train.records.rank_errors import write_error_record
from hpc_train.records.rundir import RecordNotWritten


def load_job_spec(path: Path) -> DictConfig:
    cfg = OmegaConf.load(path)
    assert isinstance(cfg, DictConfig)
    return cfg


def train(cfg: DictConfig) -> Optional[Dict[str, Any]]:
    """Train as this process's rank of the job described by `cfg` (a completed job spec). Returns the summary.

    A script job (``script.argv``) runs the user's script instead, without importing torch here:
    its task only starts and watches the script. Each path reads the spec into its typed settings
    first thing (TrainingSettings, ScriptJobSettings), and its parts take those.
    """
    try:
        ranks = detect_ranks()
    except ValueError as err:  # a malformed Slurm variable (node list, tasks per node): name it, no traceback
        raise Refusal(f"cannot tell this process's rank from its environment: {err}") from None
    run_dir = Path(cfg.job.run_dir)
    keeper = _hold_run_dir(cfg, ranks, run_dir)  # before this rank touches a file of the run dir
    ended = True  # for good: the run dir is free again; an interrupted Slurm job may be requeued into it
    try:
        log = setup_logging(run_dir, ranks.global_rank)
        if is_script_job(cfg):  # the user's own script: run it as this rank (no trainer, no process group here)
            _announce(log, ranks)
            try:
                return run_script(cfg, ranks, run_dir)
            except ScriptFailed as err:
                write_error_record(run_dir, ranks.global_rank, err)
                log.error("%s", err)
                raise
        return _train(cfg, ranks, run_dir, log)
    except TrainingInterrupted:
        ended = run_claim.slurm_job_id() is None
        raise
    finally:
        if keeper is not None:
            keeper.stop()
            if ended and ranks.global_rank == 0:  # every replica group's rank 0 keeps the claim; the first releases it
                run_claim.release(run_dir, keeper.token)


def _hold_run_dir(cfg: DictConfig, ranks: RankInfo, run_dir: Path) -> Optional[run_claim.Keeper]:
    """Rank 0 claims the run dir (its own launch's claim, or a dead job's) and keeps the claim fresh; a run dir
    held by another live job refuses this one before anything is written. Each replica group's rank 0 keeps the same
    claim (one run), so that it stays fresh while any group lives."""
    if not ranks.is_main:
        return None
    token = run_claim.rank_token(cfg.job)
    try:
        taken_over = run_claim.acquire(run_dir, token, run_claim.slurm_job_id())
    except run_claim.RunDirBusy as busy:
        raise Refusal(str(busy)) from None
    if taken_over:
        print(f"hpc-train: {taken_over}", file=sys.stderr, flush=True)
    return run_claim.Keeper(run_dir, token).start()


def _announce(log: logging.Logger, ranks: RankInfo, devices: str = "") -> None:
    """Who this process is, in its log (and rank 0's on the console), and what the rank detection ignored."""
    log.info(
        "rank %d/%d (local %d, started by %s) on host %s%s, rendezvous %s:%d",
        ranks.rank,
        ranks.world_size,
        ranks.local_rank,
        ranks.origin,
        socket.gethostname(),
        devices,
        ranks.master_addr,
        ranks.master_port,
    )
    image = image_record()
    if "image" in image:
        log.info(
            "runs %s (Python %s, torch %s) in the image %s (%s; root %s)",
            image["executable"],
            image.get("python"),
            image.get("torch"),
            image["image"],
            image.get("runtime"),
            image.get("root"),
        )
    if ranks.note:
        log.warning("%s", ranks.note)


def _train(cfg: DictConfig, ranks: RankInfo, run_dir: Path, log: logging.Logger) -> Optional[Dict[str, Any]]:
    """hpc_train's own trainer as this rank. The job spec is read once, here, into the settings of the rank's parts;
    nothing after reads the spec. The layout is the allocation's: a job planned for a range of nodes runs on the
    count Slurm gave it (and a replica group's is its group's). The stop signals (interrupts.StopFlag) are the
    run's for its length: their previous handlers are back before the process group is torn down."""
    # torch and the trainer's parts: a script job's task (train() above) starts the user's script without them
    from hpc_train.compute.checkpointing.checkpointer import CheckpointSettings
    from hpc_train.compute.data.loaders import DataSettings
    from hpc_train.compute.parallel import strategy_class
    from hpc_train.compute.runtime import distributed
    from hpc_train.compute.runtime.heartbeat import WatchdogSettings
    from hpc_train.compute.runtime.interrupts import LauncherSettings, StopFlag, signal_number
    from hpc_train.compute.training.loggers import logger_settings
    from hpc_train.compute.training.optim import OptimSettings
    from hpc_train.compute.training.settings import RunSettings, TrainerSettings, TrainingSettings

    planned = section(JobSettings, cfg.job)
    replica = replica_settings(cfg)  # fault_tolerance.replica_groups: this rank's group is a job of its own to torch
    if replica is not None:
        planned = replace(planned, layout=group_layout(planned.layout, int(replica.replica_groups)))
    job = replace(planned, layout=settle_layout(planned.layout, cfg.strategy, ranks.world_size))
    settings = TrainingSettings(
        run=section(RunSettings, cfg),
        job=job,
        planned_layout=planned.layout,
        replicas=replica,
        trainer=section(TrainerSettings, cfg.trainer),
        optim=section(OptimSettings, cfg.trainer),
        checkpointing=section(CheckpointSettings, cfg.trainer),
        watchdog=section(WatchdogSettings, cfg.trainer),
        strategy=section(strategy_class(strategy_id(cfg.strategy)).settings_type, cfg.strategy),
        data=section(DataSettings, cfg.data),
        logger=logger_settings(cfg.logger if "logger" in cfg else None),
        launcher=section(LauncherSettings, cfg.launcher),
        backend=backend_section(cfg),
        peak_tflops=OmegaConf.to_container(cfg.cluster, resolve=True)["gpu_peak_tflops"],  # type: ignore[index]
        job_spec=OmegaConf.to_container(cfg, resolve=True),  # type: ignore[arg-type]
    )
    devices = _prepare_process(settings, ranks, log)
    stop_flag = StopFlag(signal_number(str(settings.launcher.signal)))
    try:
        with handling(stop_flag.stop_signals, stop_flag.on_signal):
            return _fit(settings, ranks, devices, run_dir, stop_flag, log)
    finally:
        release_before_teardown()
        distributed.teardown()


def _fit(
    settings: Any, ranks: RankInfo, devices: List[Any], run_dir: Path, stop_flag: Any, log: logging.Logger
) -> Optional[Dict[str, Any]]:
    """The process group joined, the trainer's fit, and how it ended in the attempt log."""
    # torch and the trainer, as in _train: a script job's task starts the user's script without them
    from hpc_train.compute.runtime import distributed
    from hpc_train.compute.runtime.heartbeat import Heartbeat
    from hpc_train.compute.training.trainer import Trainer

    # progress, hang watchdog, 2nd stop signal (a replica group watches its own ranks)
    beat = Heartbeat(run_dir, ranks, settings.watchdog, stop_flag).start()
    trainer = group = None

    def record_end(how: str) -> None:
        if trainer is not None and trainer.is_main:
            _record_attempt_end(run_dir, trainer, how)

    try:
        problem = allocation_mismatch(settings.planned_layout, ranks)
        if problem:  # training alone (or in a wrong world) would "succeed" with the wrong result
            raise Refusal(problem)
        distributed.init_process_group(
            ranks, str(settings.strategy.backend), float(settings.watchdog.dist_timeout_s), devices[0], run_dir
        )
        group = _replica_group(settings.replicas, ranks, devices[0])
        trainer = Trainer(settings, ranks, devices, run_dir, stop_flag, group)
        summary = trainer.fit()
        record_end("finish")
        distributed.barrier()
        return summary
    except TrainingInterrupted as stop:
        log.warning("rank %d: %s", ranks.rank, stop)
        record_end(stop.reason)
        raise
    except BaseException as err:
        _record_failure(err, run_dir, ranks, log)
        with contextlib.suppress(RecordNotWritten):  # a full disk: the first record refused is the message
            record_end("crash" if isinstance(err, Exception) else f"stopped ({type(err).__name__})")
        raise
    finally:
        if group is not None:
            group.close()
        beat.close()
        trainer = None  # noqa: F841 (see release_before_teardown)


def _prepare_process(settings: Any, ranks: RankInfo, log: logging.Logger) -> List[Any]:
    """The user's code made importable, torch's threads set to the CPUs Slurm gave the task; this rank's devices,
    announced in its log."""
    # torch: a script job's task (train() above) starts the user's script without it
    import torch

    from hpc_train.compute.runtime import distributed
    from hpc_train.compute.user.instantiate import add_code_dirs

    add_code_dirs(settings.job.code_dirs)  # the user's package, importable as on the submitting side
    threads = os.environ.get("SLURM_CPUS_PER_TASK") or os.environ.get("OMP_NUM_THREADS")
    if threads:
        torch.set_num_threads(int(threads))
    devices = distributed.task_devices(ranks, int(settings.job.layout.gpus_per_task))
    _announce(log, ranks, f", devices {[str(d) for d in devices]}")
    return devices


def _replica_group(replica: Any, ranks: RankInfo, device: Any) -> Any:
    """This rank's replica group (None: the run has no replica groups), joined through the lighthouse its launcher
    started."""
    if replica is None:
        return None
    if LIGHTHOUSE_VARIABLE not in os.environ:  # torchrun, or an allocation of packed runs: no lighthouse
        raise Refusal(
            "fault_tolerance.replica_groups: this rank was not started by hpc-train's local or Slurm launcher,"
            " which start the groups' lighthouse. Fix: launch with launcher=local or launcher=slurm, or"
            " fault_tolerance.replica_groups=null."
        )
    from hpc_train.compute.replicas.group import ReplicaGroup  # torchft: only runs with replica groups

    return ReplicaGroup(replica, ranks, device, os.environ[LIGHTHOUSE_VARIABLE])


def _record_attempt_end(run_dir: Path, trainer: Any, how: str) -> None:
    """How this attempt ended, in attempts.jsonl (by the main rank)."""
    from hpc_train.compute.runtime import attempts  # the trainer's side (torch): not a script job's

    if trainer.attempt:
        attempts.end(run_dir, trainer.attempt, how, trainer.state.global_step)
    else:  # a replica group that leads now, started after the attempt began
        attempts.end_current(run_dir, how, trainer.state.global_step)


def _record_failure(err: BaseException, run_dir: Path, ranks: RankInfo, log: logging.Logger) -> None:
    """This rank's failure record (first, before peers see broken connections) and its log: a refusal's one line
    (on the console by rank 0), else the traceback."""
    write_error_record(run_dir, ranks.global_rank, err)
    if isinstance(err, REFUSALS):
        log.error("%s", err)
        err.on_console = ranks.is_main
    else:
        log.error("rank %d failed:\n%s", ranks.rank, traceback.format_exc())
