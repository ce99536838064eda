"""Any Hydra app's sweep on Slurm (or locally): ``hydra/launcher=hpc_train_slurm`` / ``hpc_train_local``.

A drop-in for hydra-submitit-launcher: the same keys with the same meaning (:class:`AppLauncherConf`),
the app's task function run in each job as Hydra's own ``run_job`` runs it (the job's composed
config, ``hydra.job.*``, the working dir, ``.hydra/`` files, custom resolvers and other singleton
state carried to the job), its return value handed back to the sweeper. What it adds:

* **per-job resources**: each job's ``hydra.launcher`` node is read from that job's own composed
  config, so ``hydra.launcher.gpus_per_node=${model.gpus}`` gives every job its own ``--gres``;
  jobs with equal parameters go into one array, cut under MaxArraySize and throttled by
  ``array_parallelism``, through the same code as hpc-train's own sweeps
  (:func:`hpc_train.launch.backends.slurm.submit.submit_jobs`), with the same job table (``jobs.tsv``);
* **failed means failed**: a job whose task function raised exits non-zero (``sacct`` says
  FAILED, not COMPLETED), and the launcher counts it as failed; the exception is still handed
  back to the sweeper as Hydra's launchers do;
* **packed sweeps**: ``hydra.launcher.pack.allocations=N`` runs the jobs as job steps of N Slurm jobs
  (hpc_train.launch.backends.slurm.packed, as hpc-train's own ``launcher.pack``), each step running the job's
  pickled task (hpc_train.pack.app_step); their return values come back to the sweeper as from submitit's jobs;
* **dry run**: ``hydra.launcher.dry_run=true`` prints what would be queued and queues nothing.

Hydra itself refuses to *sweep* a ``hydra.*`` key (``hydra.launcher.gpus_per_node=1,2``: "Sweeping
over Hydra's configuration is not supported"); set the key from the job's own config instead
(``hydra.launcher.gpus_per_node=${gpus} +gpus=1,2``).
"""

from __future__ import annotations

import logging
import os
import re
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, NoReturn, Optional, Sequence, Tuple

import cloudpickle
from hydra.core.singleton import Singleton
from hydra.core.utils import JobReturn, JobStatus, filter_overrides
from omegaconf import DictConfig, OmegaConf

from hpc_train.config.errors import ConfigError
from hpc_train.config.launcher import APP_LOCAL, APP_SLURM
from hpc_train.containers.checks import check_container
from hpc_train.containers.settings import ContainerSettings
from hpc_train.jobs import job_table, submissions, sweep_status
from hpc_train.launch.backends.registry import app_backend
from hpc_train.launch.backends.slurm import follow as slurm_follow
from hpc_train.launch.backends.slurm import packed as pack
from hpc_train.launch.backends.slurm import params as slurm_params
from hpc_train.launch.backends.slurm import queueing as slurm_queueing
from hpc_train.launch.backends.slurm import submit as slurm
from hpc_train.launch.backends.slurm import submitit_import
from hpc_train.launch.backends.slurm.step import STEP_KEY
from hpc_train.launch.hydra import hydra_internals
from hpc_train.launch.hydra.app_config import (
    LOCAL_KEYS,
    SLURM_NAMES,
    apply_profile,
    cluster_profile,
    container_section,
    slurm_parameters,
)
from hpc_train.launch.hydra.app_task import RETURN_FILE, AppJob, AppTask, SharedPart
from hpc_train.launch.hydra.launcher_base import SweepLauncherBase
from hpc_train.launch.planning import capacity
from hpc_train.launch.planning.objective import sweeper_target
from hpc_train.launch.planning.sweep_limits import check_sweep_fits
from hpc_train.pack import app_step, records, status
from hpc_train.pack.records import PackedRun
from hpc_train.records import rundir
from hpc_train.records.rundir import EXIT_CTRL_C, EXIT_REFUSED

log = logging.getLogger(__name__)


class AppLauncher(SweepLauncherBase):
    """Shared by the Slurm and the local variant: ``launcher_name`` (its name in ``hydra/launcher``) picks the
    backend of its jobs in the registry; a backend that runs jobs on this machine takes submitit's local executor."""

    launcher_name = APP_SLURM.name

    def __init__(self, **params: Any) -> None:
        super().__init__()
        self.params = params  # the primary config's launcher node (each job reads its own, see launch)
        self.backend = app_backend(self.launcher_name)

    def _dry_run(self) -> bool:
        assert self.config is not None
        return bool(OmegaConf.select(self.config, "hydra.launcher.dry_run", default=False))

    def _refuse_taken(self, err: ConfigError) -> None:
        """The sweep dir another sweep holds: one message and exit code 2; its status stays the other sweep's."""
        print(err, file=sys.stderr, flush=True)
        raise SystemExit(EXIT_REFUSED)

    def _launch(
        self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int, sweep_dir: Path
    ) -> Sequence[JobReturn]:
        assert self.config is not None and self.hydra_context is not None and self.task_function is not None
        local = self.backend.kind.on_this_machine
        shared = self.shared_part(sweep_dir / ".hpc_train" / f"app_task_{initial_job_idx}.pkl")
        jobs: List[AppJob] = []
        same = None if _interpolated(self.config.hydra.launcher) else _plain(self.config.hydra.launcher)
        for i, overrides in enumerate(job_overrides):
            jobs.append(self.app_job(shared, list(overrides), initial_job_idx + i, same))
            log.info("\t#%d : %s", initial_job_idx + i, " ".join(filter_overrides(overrides)))
        wait = bool(jobs[0].launcher.get("wait", True))
        if not wait:
            _check_no_wait(self.config.hydra, sweep_dir)
        try:
            shape = None if local else pack_shape(jobs[0].launcher)
        except ConfigError as err:
            refuse(sweep_dir, err)
        handles: Optional[List[Any]]
        if shape is not None:  # each handle a packed run's id
            handles = self._submit_packed(jobs, shape, sweep_dir)
        else:
            handles = self._submit_local(jobs, sweep_dir) if local else self._submit_slurm(jobs, sweep_dir)
        if handles is None:  # a dry run: nothing was queued
            return [_completed(job.overrides, None) for job in jobs]
        if not wait:  # submit and come back: the jobs' ids stand for their results
            print(
                f"hpc-train: {len(jobs)} job(s) queued; sweep dir {sweep_dir}; follow them with:"
                f" hpc-train-report {sweep_dir} --watch"
            )
            return [_completed(job.overrides, _job_id(handle)) for job, handle in zip(jobs, handles)]
        if shape is not None:
            returns = _packed_results(sweep_dir, jobs, handles)
        else:
            since = time.time()
            returns = [_result(handle, job.overrides, since, local) for job, handle in zip(jobs, handles)]
        failed = sum(1 for ret in returns if ret.status == JobStatus.FAILED)
        print(f"hpc-train: {len(returns)} job(s): {len(returns) - failed} completed, {failed} failed", file=sys.stderr)
        return returns

    def app_job(
        self, shared: SharedPart, overrides: List[str], num: int, same: Optional[Dict[str, Any]] = None
    ) -> AppJob:
        """Job number `num`: its task, and its own hydra.launcher node (`same`: the node every job shares, when it
        interpolates nothing of the job's own config; else read from the job's composed config)."""
        assert self.config is not None and self.hydra_context is not None
        launcher = same
        if launcher is None:
            launcher = _plain(self.hydra_context.config_loader.load_sweep_config(self.config, overrides).hydra.launcher)
        return AppJob(num, overrides, launcher, AppTask(shared, overrides, num))

    def shared_part(self, path: Path) -> SharedPart:
        """What every job of this launch shares, pickled once; a dry run's tasks never run, so it pickles nothing into
        the sweep dir (where another sweep's tasks may be)."""
        if self._dry_run():
            return SharedPart(path)
        return SharedPart.write(
            path,
            hydra_context=self.hydra_context,
            task_function=self.task_function,
            config=self.config,
            singleton_state=Singleton.get_state(),
        )

    def _submit_local(self, jobs: List[AppJob], sweep_dir: Path) -> List[Any]:
        """submitit's local executor, one per set of resources (each job a process of its own); the job table
        and the submission records as for Slurm, each job's id its process id (what hpc-train-report reads)."""
        submitit = submitit_import.submitit_module()  # (~50 ms): every Hydra app imports this module (our plugin)

        groups: Dict[str, List[int]] = {}
        for index, job in enumerate(jobs):
            launcher = job.launcher
            params = {key: launcher[key] for key in LOCAL_KEYS if launcher.get(key) is not None}
            groups.setdefault(repr(sorted(params.items())), []).append(index)
        handles: List[Any] = [None] * len(jobs)
        for members in groups.values():
            launcher = jobs[members[0]].launcher
            executor = submitit.LocalExecutor(folder=str(launcher["submitit_folder"]))
            executor.update_parameters(
                **{key: launcher[key] for key in LOCAL_KEYS if launcher.get(key) is not None and key != "mem_gb"}
            )
            with executor.batch():
                submitted = [executor.submit(jobs[index].task) for index in members]
            for index, handle in zip(members, submitted):
                handles[index] = handle
        rows, entries = [], []
        for job, handle in zip(jobs, handles):
            num, overrides, launcher = job.num, job.overrides, job.launcher
            params = {SLURM_NAMES.get(key, key): launcher[key] for key in LOCAL_KEYS if launcher.get(key) is not None}
            rows.append(
                job_table.JobRow(
                    str(handle.job_id), str(num), " ".join(filter_overrides(overrides)), "local: " + _describe(params)
                )
            )
            entries.append(
                {
                    "job_id": str(handle.job_id),
                    "job": str(num),
                    "folder": str(launcher["submitit_folder"]),
                    "local": True,
                }
            )
        job_table.print_and_append(sweep_dir, rows)
        submissions.record(sweep_dir, entries)
        return handles

    def _submit_slurm(self, jobs: List[AppJob], sweep_dir: Path) -> Optional[List[Any]]:
        """One PreparedJob per job, submitted in arrays by hpc-train's own submit_jobs (None: a dry run)."""
        _check_slurm_commands(jobs[0].launcher, sweep_dir)
        prepared = []
        for job in jobs:
            num, overrides, launcher, task = job.num, job.overrides, job.launcher, job.task
            label = " ".join(filter_overrides(overrides))
            try:  # before anything is queued: one bad job, or one that no node can hold, stops the sweep
                params = _job_parameters(launcher, sweep_dir)
                capacity.check_capacity(params, "hydra.launcher.timeout_min", keys=capacity.APP_KEYS)
            except ConfigError as err:
                refuse(sweep_dir, _for_job(num, label, err))
            prepared.append(
                slurm.PreparedJob(
                    None,
                    None,
                    params,
                    label,
                    sweep_dir,
                    int(launcher.get("max_num_timeout") or 0),
                    payload=task,
                    folder=Path(str(launcher["submitit_folder"])),
                )
            )
        if jobs and jobs[0].launcher.get("dry_run"):
            for app_job, job in zip(jobs, prepared):
                print(f"#{app_job.num} {job.label}: {_describe(job.params)}")
            return None
        try:
            check_sweep_fits(len(prepared), {job.params.get("account") for job in prepared}, None)
            submitted = slurm.submit_jobs(prepared, log_root=sweep_dir)
        except ConfigError as err:  # the cluster's job limits, or sbatch's refusal (nothing left queued)
            refuse(sweep_dir, _in_app_keys(err))
        except (
            slurm_queueing.SubmissionInterrupted
        ) as interrupted:  # Ctrl-C part-way: as hpc-train itself says it and exits
            print(interrupted, file=sys.stderr, flush=True)
            raise SystemExit(interrupted.exit_code) from None
        handles = {id(job): handle for job, handle in submitted}
        rows = [
            job_table.JobRow(str(handles[id(job)].job_id), str(app_job.num), job.label, _describe(job.params))
            for app_job, job in zip(jobs, prepared)
        ]
        job_table.print_and_append(sweep_dir, rows)
        numbers = {id(job): str(app_job.num) for app_job, job in zip(jobs, prepared)}
        submissions.record(sweep_dir, slurm.submission_records(submitted, [numbers[id(job)] for job, _ in submitted]))
        return [handles[id(job)] for job in prepared]

    def _submit_packed(self, jobs: List[AppJob], shape: pack.PackShape, sweep_dir: Path) -> Optional[List[str]]:
        """hydra.launcher.pack: the jobs shared out among a few allocations (hpc_train.launch.backends.slurm.packed),
        each a job step running its pickled task (hpc_train.pack.app_step) with the layout its own hydra.launcher node
        gives it; the packed runs' ids (None: a dry run). Everything is checked before anything is queued."""
        _check_slurm_commands(jobs[0].launcher, sweep_dir)
        runs, params, requeues = [], [], []
        for job in jobs:
            try:
                run, job_params = packed_job(job, sweep_dir)
            except ConfigError as err:
                refuse(sweep_dir, err)
            runs.append(run)
            params.append(job_params)
            requeues.append(int(job.launcher.get("max_num_timeout") or 0))
        first = jobs[0].launcher
        try:
            plans = pack.plan_packed(
                runs,
                params,
                requeues,
                shape,
                sweep_dir,
                PACK_SIGNAL,
                int(first.get("signal_delay_s") or 0),
                APP_PACK_KEYS,
                APP_PACK_SHARED,
            )
            check_sweep_fits(len(plans), {p.get("account") for p in params}, None)
        except ConfigError as err:
            err = _in_app_keys(err)
            refuse(sweep_dir, ConfigError(err.key, f"{err.problem} Nothing was queued.", err.fix))
        if first.get("dry_run"):
            for plan, plan_params in plans:
                print(pack.describe(plan, plan_params, sweep_dir))
            for run, job_params in zip(runs, params):
                print(f"#{run.job} {run.label}: {_describe(job_params)}")
            return None
        for job, run in zip(jobs, runs):  # before sbatch: an allocation may start its first step at once
            folder = Path(run.run_dir)
            folder.mkdir(parents=True, exist_ok=True)
            (folder / app_step.RETURN_FILE).unlink(missing_ok=True)  # an earlier launch's, in a reused sweep dir
            rundir.write_bytes_atomic(cloudpickle.dumps(job.task), folder / app_step.TASK_FILE)
        try:
            rows = [(run.job, run.label, _describe(job_params)) for run, job_params in zip(runs, params)]
            submitted, ids = pack.queue(plans, sweep_dir, rows)
        except ConfigError as err:  # sbatch's refusal (pack.submit cancelled what it had queued)
            refuse(sweep_dir, _in_app_keys(err))
        except slurm_queueing.SubmissionInterrupted as interrupted:
            print(interrupted, file=sys.stderr, flush=True)
            raise SystemExit(interrupted.exit_code) from None
        print(
            f"hpc-train: {len(runs)} job(s) packed into {len(submitted)} allocation(s):"
            f" {', '.join(str(plan.job_id) for plan in submitted)}"
        )
        return [ids[run.job] for run in runs]


APP_WORDS = slurm.SlurmWords(  # a refusal for want of Slurm, in the app's keys
    "hydra/launcher",
    f"hydra/launcher={APP_SLURM.name}",
    "hydra.launcher.dry_run=true",
    f"hydra/launcher={APP_LOCAL.name} to run the jobs here",
)
PACK_SIGNAL = "USR2"  # submitit's: Slurm sends it signal_delay_s before an allocation's time limit
# What the runs of one allocation must agree on: hpc-train's list, and the app launcher's other sbatch keys of a job.
APP_PACK_SHARED = (*pack.SHARED, "exclude", "comment", "mem_per_cpu", "mem_per_gpu")
APP_PACK_KEYS = pack.PackKeys(
    pack="hydra.launcher.pack",
    run_gpus="hydra.launcher.gpus_per_node",
    cpus_per_gpu="hydra.launcher.cpus_per_gpu",
    capacity=capacity.Keys(
        "hydra.launcher.pack.nodes",
        "hydra.launcher.pack.gpus_per_node",
        "hydra.launcher.cpus_per_gpu",
        True,
        "hydra.launcher.mem_gb",
        "hydra.launcher.partition",
    ),
)


def packed_job(job: AppJob, sweep_dir: Path, key: Optional[str] = None) -> Tuple[PackedRun, Dict[str, Any]]:
    """The job as a packed run, `key` its id (default: its number), and its sbatch parameters; ConfigError (in the
    app's keys, naming the job) for one that cannot be."""
    label = " ".join(filter_overrides(job.overrides))
    try:
        job_params = _job_parameters(job.launcher, sweep_dir)
        extra = dict(job_params.get("additional_parameters") or {})
        extra.setdefault("signal", f"{PACK_SIGNAL}@{int(job.launcher.get('signal_delay_s') or 0)}")  # submitit's
        job_params["additional_parameters"] = extra
        return _packed_run(key or str(job.num), label, job_params, sweep_dir), job_params
    except ConfigError as err:
        raise _for_job(job.num, label, err) from None


def pack_shape(launcher: Dict[str, Any]) -> Optional[pack.PackShape]:
    """hydra.launcher.pack.* completed by pack.pack_shape (None: not packed), from the app's own settings: GPUs per
    node from the cluster profile, the time from timeout_min (else 60), CPUs per GPU from
    hydra.launcher.cpus_per_gpu, else the profile's, else 1."""
    settings = launcher.get("pack") or {}
    if settings.get("allocations") is None:  # before the cluster profile is read
        return None
    profile = cluster_profile(str(launcher["cluster"])) if launcher.get("cluster") else {}
    cluster = {
        "gpus_per_node": profile.get("gpus_per_node"),
        "cpus_per_gpu": launcher.get("cpus_per_gpu") or profile.get("cpus_per_gpu"),
        "time": launcher.get("timeout_min") or 60,
    }
    keys = pack.PackKeys(
        **{**APP_PACK_KEYS.__dict__, "time": "hydra.launcher.timeout_min", "profile": " (hydra.launcher.cluster)"}
    )
    return pack.pack_shape({"launcher": {"pack": dict(settings)}, "cluster": cluster}, keys)


def _packed_run(job: str, label: str, params: Dict[str, Any], sweep_dir: Path) -> PackedRun:
    """One job as a packed run: the layout its sbatch parameters ask for, its step running its pickled task."""
    nodes, tasks = int(params.get("nodes") or 1), int(params.get("ntasks_per_node") or 1)
    if params.get("gpus_per_task") is not None:
        gpus_per_task = int(params["gpus_per_task"])
    else:
        gpus = capacity._requested_gpus(params)  # gpus_per_node or gres, as the capacity check reads them
        if gpus % tasks:
            raise ConfigError(
                "hydra.launcher.gpus_per_node",
                f"a packed job's tasks each get the same GPUs, and {gpus} GPUs per node do not split among"
                f" {tasks} tasks per node.",
                "set hydra.launcher.gpus_per_node to a multiple of hydra.launcher.tasks_per_node"
                " (or hydra.launcher.gpus_per_task).",
            )
        gpus_per_task = gpus // tasks
    cpus = params.get("cpus_per_task")
    if cpus is None:
        cpus = int(params.get("cpus_per_gpu") or 1) * max(1, gpus_per_task)
    folder = app_step.run_folder(sweep_dir, job).absolute()
    return PackedRun(
        job=job,
        run_dir=str(folder),
        label=label,
        nodes=nodes,
        tasks_per_node=tasks,
        gpus_per_task=gpus_per_task,
        cpus_per_task=int(cpus),
        command=[sys.executable, "-u", "-m", app_step.__name__, str(folder)],
    )


def _packed_results(sweep_dir: Path, jobs: List[AppJob], ids: List[str]) -> List[JobReturn]:
    """Wait for every packed run of this launch to end; each one's JobReturn (a failed one if it left none)."""
    numbers = [str(job.num) for job in jobs]
    try:
        while True:
            states = status.packed_states(sweep_dir)
            if all(job in states and states[job].state in records.ENDED_STATES for job in numbers):
                break
            time.sleep(pack.FOLLOW_POLL_S)
    except KeyboardInterrupt:  # the runs are their allocations' now, and go on
        print(
            f"hpc-train: stopped waiting; the runs go on in their allocations; follow them with: hpc-train-report"
            f" {sweep_dir} --watch",
            file=sys.stderr,
            flush=True,
        )
        raise SystemExit(EXIT_CTRL_C) from None
    returns = []
    for job, app_job, packed in zip(numbers, jobs, ids):
        overrides = app_job.overrides
        path = app_step.run_folder(sweep_dir, job) / app_step.RETURN_FILE
        if path.exists():
            returns.append(cloudpickle.loads(path.read_bytes()))
            continue
        state = states[job]
        code = "" if state.exit_code is None else f" (exit code {state.exit_code})"
        why = records.refusal(state) or f"see {app_step.run_folder(sweep_dir, job) / rundir.SLURM_LOGS}"
        returns.append(
            _failed(overrides, RuntimeError(f"packed run {packed} ended {state.state}{code} without a result: {why}"))
        )
    return returns


def _check_slurm_commands(launcher: Dict[str, Any], sweep_dir: Path) -> None:
    """Slurm's commands, needed to queue (not for a dry run, which works on a laptop): refused in the app's keys."""
    if launcher.get("dry_run"):
        return
    try:
        slurm.check_slurm_commands(APP_WORDS)
    except ConfigError as err:
        refuse(sweep_dir, err)


def _job_parameters(launcher: Dict[str, Any], sweep_dir: Path) -> Dict[str, Any]:
    """One job's sbatch parameters, its partition checked (ConfigError: a profile's refusal names hpc-train's keys,
    _for_job names the app's)."""
    filled = apply_profile(launcher)
    params = slurm_parameters(filled)
    slurm_params.check_partition(params, capacity.APP_KEYS.partition)
    params[STEP_KEY] = _step(filled, sweep_dir)
    return params


def _step(launcher: Dict[str, Any], sweep_dir: Path) -> Dict[str, Any]:
    """The job step's description (hpc_train.launch.backends.slurm.step): the app's container, checked, with the
    sweep dir mounted."""
    section = container_section(launcher)
    binds = [str(Path(sweep_dir).absolute())]
    try:
        check_container(ContainerSettings.from_section(section), [os.getcwd(), *binds], on_this_machine=False)
    except ConfigError as err:
        fix = err.fix.replace("container.", "hydra.launcher.container.")
        raise ConfigError(f"hydra.launcher.{err.key}", err.problem, fix) from None
    gpus = bool(launcher.get("gpus_per_node") or launcher.get("gres") or launcher.get("gpus_per_task"))
    return {"container": section, "binds": binds, "gpus": gpus}


def _for_job(num: int, label: str, err: ConfigError) -> ConfigError:
    """A job's refusal in the app's keys, saying which job and that nothing was queued."""
    err = _in_app_keys(err)
    return ConfigError(err.key, f"sweep job #{num} ({label}): {err.problem} Nothing was queued.", err.fix)


SAME_FOR_EVERY_JOB = {"hydra.sweep.dir", "hydra.job.name"}  # what the default keys interpolate


def _interpolated(node: Any) -> bool:
    """Whether the node interpolates anything that may differ from job to job (anything but SAME_FOR_EVERY_JOB)."""
    container = OmegaConf.to_container(node, resolve=False)
    return any(ref.strip() not in SAME_FOR_EVERY_JOB for ref in re.findall(r"\$\{([^}]*)\}", repr(container)))


def _plain(node: Any) -> Dict[str, Any]:
    launcher = OmegaConf.to_container(node, resolve=True)
    assert isinstance(launcher, dict)
    return launcher


def _describe(params: Dict[str, Any]) -> str:
    parts = [f"{params.get('nodes', 1)} node(s) x {params.get('ntasks_per_node', 1)} task(s)"]
    for key in ("gres", "gpus_per_node", "cpus_per_task", "partition"):
        if params.get(key) is not None:
            parts.append(f"{key} {params[key]}")
    return ", ".join(parts)


RESULTLESS_SWEEPERS = (
    hydra_internals.BASIC_SWEEPER,
    "hydra_plugins.hpc_train_launcher.HpcTrainSweeper",
    "hydra_plugins.hpc_train_launcher.AdaptiveSweeper",  # reads each trial's reported objective from its dir
)  # sweepers that read no job's result: the only ones hydra.launcher.wait=false can serve


def _check_no_wait(hydra_cfg: DictConfig, sweep_dir: Path) -> None:
    sweeper = sweeper_target(hydra_cfg)
    if sweeper not in RESULTLESS_SWEEPERS:  # one message and exit code 2, as hpc-train's own refusals
        refuse(
            sweep_dir,
            ConfigError(
                "hydra.launcher.wait",
                f"wait=false queues the jobs and returns before they end, but the sweeper {sweeper} reads each job's"
                " result to choose the next ones.",
                "set hydra.launcher.wait=true with this sweeper, or use Hydra's basic sweeper (a grid) with"
                " wait=false.",
            ),
        )


# hpc-train's keys, as shared refusals (sbatch's words, a cluster profile's) name them -> a Hydra app's launcher keys
APP_KEYS = {
    "cluster.partition": "hydra.launcher.partition",
    "cluster.account": "hydra.launcher.account",
    "cluster.qos": "hydra.launcher.qos",
    "cluster.constraint": "hydra.launcher.constraint",
    "cluster.mem_gb": "hydra.launcher.mem_gb",
    "cluster.cpus_per_gpu": "hydra.launcher.cpus_per_task",
    "cluster.extra": "hydra.launcher.additional_parameters",
    "cluster.gpu_flag": "hydra.launcher.gres",
    "resources.gpus_per_node": "hydra.launcher.gpus_per_node",
    "resources.time": "hydra.launcher.timeout_min",
    "resources": "hydra.launcher",
}


def _in_app_keys(error: Any) -> Any:
    """The same refusal, naming the app's hydra.launcher.* keys instead of hpc-train's."""
    pattern = re.compile(
        r"\b(" + "|".join(re.escape(k) for k in sorted(APP_KEYS, key=len, reverse=True)) + r")\b(?!\.\w|_)"
    )

    def reword(text: str) -> str:
        return pattern.sub(lambda match: APP_KEYS[match.group(1)], text)

    return ConfigError(APP_KEYS.get(error.key, error.key), reword(error.problem), reword(error.fix))


def refuse(sweep_dir: Path, error: Exception) -> NoReturn:
    """Bad input in an app's sweep: its one message and exit code 2 before anything is queued (no traceback)."""
    sweep_status.mark_refused(sweep_dir, str(error))
    print(error, file=sys.stderr, flush=True)
    raise SystemExit(EXIT_REFUSED)


def _job_id(handle: Any) -> str:
    """A submitit job's id, or a packed run's (its id already)."""
    return str(handle) if isinstance(handle, str) else str(handle.job_id)


def _completed(overrides: List[str], value: Any) -> JobReturn:
    """A job that was queued and not waited for (its job id as the value), or not queued at all (a dry run: None):
    COMPLETED as far as the sweep is concerned."""
    ret = JobReturn()
    ret.overrides = overrides
    ret.status = JobStatus.COMPLETED
    ret._return_value = value
    return ret


def _failed(overrides: List[str], error: BaseException) -> JobReturn:
    ret = JobReturn()
    ret.overrides = overrides
    ret.status = JobStatus.FAILED
    ret._return_value = error
    return ret


def _result(handle: Any, overrides: List[str], since: float, local: bool) -> JobReturn:
    """The job's JobReturn; a failed job's (its exception inside) from the file it left, else one made here. A Slurm
    job is followed to the end of its last attempt (hpc_train.launch.backends.slurm.follow: a requeued job's first
    attempt
    leaves a failed result while the job goes on)."""
    try:
        if not local:
            ending = slurm_follow.follow(handle, None, since)
            if ending.error is not None:
                raise ending.error
        return handle.results()[0]
    except Exception as err:  # the job failed: its task function raised, or it was killed or timed out
        path = Path(handle.paths.folder) / RETURN_FILE.format(job_id=handle.job_id)
        if path.exists():
            return cloudpickle.loads(path.read_bytes())
        return _failed(overrides, err)
