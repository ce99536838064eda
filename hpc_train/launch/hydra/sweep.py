"""Hydra launcher for `hpc-train -m ...`: every Slurm job of a sweep gets its own layout.

Registered as hydra/launcher=hpc_train by hydra_plugins.hpc_train_launcher.

hydra-submitit-launcher builds one executor from `hydra.launcher` for the whole sweep, so
sweeping `strategy=ddp,pipeline` or `resources.gpus_per_node=2,4` cannot change --gres or
--ntasks-per-node per job. This launcher composes each job's config, validates and lays out
every job before anything is queued (one bad job: nothing submitted), groups jobs with
identical sbatch parameters into one job array, and saves a job table in the sweep dir.
Local jobs run one after another in this process, as with Hydra's basic launcher.
"""

from __future__ import annotations

import logging
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from hydra.core.utils import (
    JobReturn,
    JobStatus,
    configure_log,
    filter_overrides,
    run_job,
)
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, open_dict

from hpc_train.config.errors import ConfigError
from hpc_train.config.launcher import launcher_kind
from hpc_train.jobs import job_table, submissions
from hpc_train.launch.backends.slurm import packed as pack
from hpc_train.launch.backends.slurm import params as slurm_params
from hpc_train.launch.backends.slurm import queueing as slurm_queueing
from hpc_train.launch.backends.slurm import submit as slurm
from hpc_train.launch.backends.slurm.follow import follow_job
from hpc_train.launch.hydra import forwarding, hydra_internals
from hpc_train.launch.hydra.launcher_base import SweepLauncherBase
from hpc_train.launch.hydra.sweep_configs import JobConfig, SweepConfigs
from hpc_train.launch.planning import auto_layout, memory_check
from hpc_train.launch.planning.errors import JobFailed
from hpc_train.launch.planning.jobspec import write_job_spec, write_yaml
from hpc_train.launch.planning.objective import read_objective, sweeper_wants_objective
from hpc_train.launch.planning.plan import RunPlan
from hpc_train.launch.planning.sweep_limits import check_sweep_fits
from hpc_train.records import rundir

log = logging.getLogger(__name__)

PROGRESS_EVERY = 1000  # jobs between two progress lines of a big sweep


class SweepLauncher(SweepLauncherBase):
    """hpc-train's own sweeps (``hydra/launcher=hpc_train``): each job's config checked and laid out before anything
    runs; the jobs whose launcher queues them go to Slurm in arrays (or packed), the others run here one by one."""

    def __init__(self) -> None:
        super().__init__()
        self._configs: Optional[SweepConfigs] = None

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        super().setup(hydra_context=hydra_context, task_function=task_function, config=config)
        self._configs = SweepConfigs(hydra_context.config_loader, config)

    def _before_launch(self, config: DictConfig) -> None:
        configure_log(config.hydra.hydra_logging, config.hydra.verbose)

    def _runs_elsewhere(self) -> bool:
        return forwarding.wanted(self.config)

    def _dry_run(self) -> bool:
        assert self.config is not None
        return bool(self.config.get("dry_run", False))

    def _launch(
        self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int, sweep_dir: Path
    ) -> Sequence[JobReturn]:
        assert self.config is not None and self.task_function is not None and self.hydra_context is not None
        assert self._configs is not None
        progress = Progress(len(job_overrides), "composed")
        jobs: List[JobConfig] = []
        for i, overrides in enumerate(job_overrides):
            jobs.append(self._configs.resolved(overrides, initial_job_idx + i))
            progress.tick()
        if jobs and forwarding.wanted(jobs[0].view):  # cluster.login: checked here, submitted by the cluster
            self._forward(jobs)
        slurm_idx = [i for i, job in enumerate(jobs) if launcher_kind(job.view.launcher.name).submits]  # as arrays
        returns: List[Optional[JobReturn]] = [None] * len(jobs)
        if slurm_idx:
            batch = [(initial_job_idx + i, job_overrides[i], jobs[i]) for i in slurm_idx]
            for i, ret in zip(slurm_idx, self._submit(batch, sweep_dir)):
                returns[i] = ret
        dry_run = bool(jobs[0].view.dry_run) if jobs else False
        local_idx = [i for i in range(len(jobs)) if returns[i] is None]
        del jobs  # a local job composes its whole config when it runs
        for i in local_idx:
            sweep_config = self._configs.full(job_overrides[i], initial_job_idx + i)
            if dry_run:
                self._leave_no_job_dir(sweep_config)
            # printed, not logged: Hydra reconfigures logging per job (this line's prefix would change after job #0)
            print(
                f"hpc-train: sweep job #{sweep_config.hydra.job.num}: {' '.join(filter_overrides(job_overrides[i]))}",
                flush=True,
            )
            returns[i] = run_job(
                hydra_context=self.hydra_context,
                task_function=self.task_function,
                config=sweep_config,
                job_dir_key="hydra.sweep.dir",
                job_subdir_key="hydra.sweep.subdir",
            )
        if local_idx and not dry_run and sweeper_wants_objective(self.config.hydra):  # batch after batch
            print(f"hpc-train: sweep dir {sweep_dir}; compare its jobs with: hpc-train-report {sweep_dir}")
        elif local_idx and not dry_run:
            _say_how_they_ended([(initial_job_idx + i, returns[i]) for i in local_idx], sweep_dir)
        return [_quiet_when_said(ret) for ret in returns]  # type: ignore[arg-type]

    def _leave_no_job_dir(self, sweep_config: DictConfig) -> None:
        """A dry run's local job writes no .hydra/ (into a real run's dir, say), and a job dir it makes goes again."""
        with open_dict(sweep_config.hydra):
            sweep_config.hydra.output_subdir = None
        if self._found is not None:
            self._found.note_job_dir(Path(str(sweep_config.hydra.sweep.dir)) / str(sweep_config.hydra.sweep.subdir))

    def _forward(self, jobs: List[JobConfig]) -> None:
        """A dry run goes on here (cluster checks over an open connection); a real sweep is validated and laid out
        here, every job, then run whole by the cluster's hpc-train (raises Forwarded)."""
        assert self.config is not None
        if jobs[0].view.dry_run:
            forwarding.dry_run_commands(jobs[0].view)
            return
        for job in jobs:
            auto_layout.check_before_forwarding(job.view, job.run_dir, job.choices)
        sweep_dir = Path(str(self.config.hydra.sweep.dir))
        forwarding.run_on_cluster(jobs[0].view, sweep_dir, self.config.hydra, multirun=True)

    def _submit(self, batch: List[Tuple[int, Sequence[str], JobConfig]], sweep_dir: Path) -> List[JobReturn]:
        """Validate, submit and (when asked, or when the sweeper optimises) follow this batch's Slurm jobs.

        Under hpc-train's own sweeper one bad job stops the whole sweep before anything is
        queued. Under a sweeper that reads return values (Optuna, ...) each trial stands alone:
        a trial whose sampled values fail validation, or whose job fails, comes back FAILED and
        the sweeper decides (hydra.sweeper.max_failure_rate).
        """
        assert self.config is not None
        optimising = sweeper_wants_objective(self.config.hydra)
        returns: List[Optional[JobReturn]] = [None] * len(batch)
        prepared = _prepare_jobs(batch, returns, optimising)
        view = batch[0][2].view
        shape = pack.pack_shape(view) if prepared else None
        if shape is not None:
            return self._submit_packed(batch, prepared, shape, sweep_dir, returns, optimising)
        if prepared:
            check_sweep_fits(
                len(prepared),
                {job.params.get("account") for _, job in prepared},
                prepared[0][1].params.get("array_parallelism"),
            )
        if view.dry_run:
            for _, job in prepared:
                print(_dry_run_line(job))
            return [_job_return(o, job.run_dir, None) for _, o, job in batch]
        if not prepared:
            return returns  # type: ignore[return-value]
        handles = _queue_arrays(batch, prepared, sweep_dir)
        if optimising or bool(view.launcher.wait):
            _follow_batch(batch, prepared, handles, returns, optimising, sweep_dir)
        for i, job in prepared:
            if returns[i] is None:
                returns[i] = _job_return(batch[i][1], job.plan.run_dir, handles[i].job_id)
        return returns  # type: ignore[return-value]

    def _submit_packed(
        self,
        batch: List[Tuple[int, Sequence[str], JobConfig]],
        prepared: List[Tuple[int, slurm.PreparedJob]],
        shape: pack.PackShape,
        sweep_dir: Path,
        returns: List[Optional[JobReturn]],
        optimising: bool,
    ) -> List[JobReturn]:
        """launcher.pack: the runs shared out among a few allocations (hpc_train.launch.backends.slurm.packed), each
        run a job step."""
        view = batch[0][2].view
        jobs = [job for _, job in prepared]
        plans = pack.plan_allocations(
            jobs, shape, sweep_dir, slurm_params.requeue_signal(view), int(view.launcher.signal_delay_s)
        )
        check_sweep_fits(len(plans), {job.params.get("account") for job in jobs}, None)
        if view.dry_run:
            for plan, params in plans:
                print(pack.describe(plan, params, sweep_dir))
            for job in jobs:
                print(_dry_run_line(job))
            return [_job_return(o, job.run_dir, None) for _, o, job in batch]
        for i, job in prepared:  # before sbatch: an allocation may start its first step at once
            _write_job_records(job, batch[i][1])
        try:
            rows = [(job.plan.run_dir.name, job.label, job.plan.layout.describe()) for job in jobs]
            submitted, ids = pack.queue(plans, sweep_dir, rows)
        except ConfigError:
            for job in jobs:  # nothing queued: no job spec a later resume would misread
                (job.plan.run_dir / "job_config.yaml").unlink(missing_ok=True)
            raise
        print(
            f"hpc-train: {len(jobs)} runs packed into {len(submitted)} allocation(s):"
            f" {', '.join(str(plan.job_id) for plan in submitted)}"
        )
        wait = bool(view.launcher.wait)
        objective = str(view.objective)
        for i, job in prepared:
            run_dir, overrides = job.plan.run_dir, batch[i][1]
            packed = ids[run_dir.name]
            if not (optimising or wait):
                returns[i] = _job_return(overrides, run_dir, packed)
                continue
            code = pack.follow(sweep_dir, run_dir)
            returns[i] = _ended(overrides, run_dir, packed, f"packed run {packed}", code, optimising, objective)
        if wait and not optimising:
            _say_how_they_ended([(batch[i][0], returns[i]) for i, _ in prepared], sweep_dir)
        return returns  # type: ignore[return-value]


def _prepare_jobs(
    batch: List[Tuple[int, Sequence[str], JobConfig]], returns: List[Optional[JobReturn]], optimising: bool
) -> List[Tuple[int, slurm.PreparedJob]]:
    """Each job of the batch planned, its spec built and its sbatch parameters made, by its index in the batch. A job
    refused: the sweep stops (ConfigError naming the job), or, for a sweeper that optimises, its trial comes back
    FAILED in `returns` and the others go on."""
    planned: List[Tuple[int, RunPlan, Dict[str, Any]]] = []
    laid_out = Progress(len(batch), "validated and laid out")
    for i, (_, overrides, job) in enumerate(batch):
        try:
            plan, spec, choice = auto_layout.planned(job.view, job.run_dir, overrides, job.choices)
            planned.append((i, plan, spec))
            if choice is not None:  # strategy=auto: the layout it chose, and why
                _chosen[plan.run_dir] = choice
        except ConfigError as err:
            _refused(err, batch[i], returns, i, optimising)
    ready = []  # the Slurm checks (partition, capacity) first: a job they refuse pays no estimate
    for i, plan, spec in planned:
        try:
            ready.append((i, slurm.prepare(plan, spec, " ".join(filter_overrides(batch[i][1])))))
        except ConfigError as err:
            _refused(err, batch[i], returns, i, optimising)
    memory_check.warm([(job.plan, job.spec) for _, job in ready])  # the distinct memories, in one process
    prepared = []
    for i, job in ready:
        try:
            memory_check.check(job.plan, job.spec, batch[i][1])
        except ConfigError as err:
            _refused(err, batch[i], returns, i, optimising)
            continue
        prepared.append((i, job))
        laid_out.tick()
    return prepared


# strategy=auto's choice for each of this process's sweep jobs that asked for it, by run dir
_chosen: Dict[Path, auto_layout.Choice] = {}


def _dry_run_line(job: slurm.PreparedJob) -> str:
    """A sweep job in its dry run: its run dir, its overrides, its layout (strategy=auto's choice named) and, where
    checked, its memory."""
    fit = memory_check.known_fit(job.plan, job.spec)
    memory = f"; memory: {fit.share_text()}" if fit is not None else ""
    choice = _chosen.get(job.plan.run_dir)
    auto = f" (strategy=auto chose {choice.chosen.candidate.words})" if choice is not None else ""
    return f"#{job.plan.run_dir.name} {job.label}: {job.plan.layout.describe()}{auto}{memory}"


def _refused(
    err: ConfigError,
    entry: Tuple[int, Sequence[str], JobConfig],
    returns: List[Optional[JobReturn]],
    i: int,
    optimising: bool,
) -> None:
    """A sweep job refused: its trial FAILED in `returns` for a sweeper that optimises, else the sweep stops."""
    num, overrides, job = entry
    label = " ".join(filter_overrides(overrides))
    if optimising:
        print(f"hpc-train: trial #{num} ({label}) not submitted: {err.message}", file=sys.stderr)
        returns[i] = _job_return(overrides, job.run_dir, err)
        return
    raise ConfigError(
        err.key,
        f"sweep job #{num} ({label}): {err.problem} Because of it, nothing was submitted.",
        err.fix,
    ) from None


def _queue_arrays(
    batch: List[Tuple[int, Sequence[str], JobConfig]], prepared: List[Tuple[int, slurm.PreparedJob]], sweep_dir: Path
) -> Dict[int, Any]:
    """The prepared jobs queued in arrays, then their records written (job spec, overrides, the sweep's job table and
    submissions); each job's handle by its index in the batch. Ctrl-C before jobs.tsv lists them cancels them all."""
    # Submitted first: a refused sbatch leaves no job_config.yaml that a later resume would misread
    # (the ranks read the spec submitit pickled; job_config.yaml is the readable record).
    with slurm_queueing.Queueing(len(prepared)) as queueing:
        submitted = queueing.submitted = slurm.submit_jobs([job for _, job in prepared], log_root=sweep_dir)
        for i, job in prepared:
            _write_job_records(job, batch[i][1])
        handles = {id(job): handle for job, handle in submitted}
        rows = [
            job_table.JobRow(str(handles[id(job)].job_id), job.plan.run_dir.name, job.label, job.plan.layout.describe())
            for _, job in prepared
        ]
        job_table.print_and_append(sweep_dir, rows)
        numbers = {id(job): job.plan.run_dir.name for _, job in prepared}
        submissions.record(sweep_dir, slurm.submission_records(submitted, [numbers[id(job)] for job, _ in submitted]))
    return {i: handles[id(job)] for i, job in prepared}


def _write_job_records(job: slurm.PreparedJob, overrides: Sequence[str]) -> None:
    """A sweep job's readable records in its run dir: its job spec and its overrides (.hydra/overrides.yaml)."""
    write_job_spec(job.spec, job.plan.run_dir)
    memory_check.keep(job.plan.run_dir, memory_check.known_fit(job.plan, job.spec))
    choice = _chosen.get(job.plan.run_dir)
    if choice is not None:
        rundir.write_json_atomic(job.plan.run_dir / rundir.LAYOUT_CHOICE, choice.record())
    hydra_dir = job.plan.run_dir / ".hydra"
    hydra_dir.mkdir(parents=True, exist_ok=True)
    write_yaml(list(overrides), hydra_dir / "overrides.yaml")


def _follow_batch(
    batch: List[Tuple[int, Sequence[str], JobConfig]],
    prepared: List[Tuple[int, slurm.PreparedJob]],
    handles: Dict[int, Any],
    returns: List[Optional[JobReturn]],
    optimising: bool,
    sweep_dir: Path,
) -> None:
    """Each queued job followed to its end, its return in `returns` (for a sweeper that optimises: its objective);
    with launcher.wait alone, the sweep's closing line."""
    objective = str(batch[0][2].view.objective)
    if optimising:
        print(f"hpc-train: waiting for this batch of {len(prepared)} job(s): the sweeper needs their {objective}")
    for i, job in prepared:
        handle = handles[i]
        overrides, run_dir = batch[i][1], job.plan.run_dir
        code = follow_job(handle, run_dir)
        job_id = str(handle.job_id)
        returns[i] = _ended(overrides, run_dir, job_id, f"Slurm job {job_id}", code, optimising, objective)
    if not optimising:
        _say_how_they_ended([(batch[i][0], returns[i]) for i, _ in prepared], sweep_dir)


def _ended(
    overrides: Sequence[str], run_dir: Path, job_id: str, what: str, code: int, optimising: bool, objective: str
) -> JobReturn:
    """A followed job's JobReturn: how it ended, or, for a sweeper that optimises, its objective (a failure when it
    failed or left none). `what`: the job in words ("Slurm job 123", "packed run 123:4")."""
    if not optimising:
        return _followed(overrides, run_dir, job_id, code)
    if code != 0:
        return _job_return(overrides, run_dir, JobFailed(f"{what} failed; see {run_dir / 'logs'}"))
    try:
        return _job_return(overrides, run_dir, read_objective(run_dir, objective))
    except JobFailed as err:
        return _job_return(overrides, run_dir, err)


def _followed(overrides: Sequence[str], run_dir: Path, job_id: str, code: int) -> JobReturn:
    """A job followed to its end (launcher.wait): COMPLETED with its job id, or FAILED with its exit code, which the
    sweep then exits with (Hydra's sweeper raises the first failed job's error once the batch is back; what failed
    was printed already)."""
    if code == 0:
        return _job_return(overrides, run_dir, job_id)
    return _job_return(
        overrides,
        run_dir,
        JobFailed(f"job {job_id} did not complete (exit code {code})", exit_code=code, reported=True),
    )


def _say_how_they_ended(followed: List[Tuple[int, Optional[JobReturn]]], sweep_dir: Path) -> None:
    """The sweep's closing line once every job was followed (each one's number and return): how many completed, which
    did not."""
    failed = [num for num, ret in followed if ret is None or ret.status == JobStatus.FAILED]
    ended = f"{len(followed) - len(failed)} completed" + (
        f", {len(failed)} did not (#{', #'.join(map(str, failed))})" if failed else ""
    )
    print(f"hpc-train: sweep of {len(followed)} job(s) ended: {ended}; compare them with: hpc-train-report {sweep_dir}")


def _quiet_when_said(ret: JobReturn) -> JobReturn:
    """A job whose failure hpc-train has printed in its own words: the sweeper reads it without Hydra's `Error
    executing job with overrides` line, so the sweep's last line stays hpc-train's (its exit code is the job's)."""
    error = hydra_internals.job_error(ret)
    return hydra_internals.quiet_failure(ret) if isinstance(error, JobFailed) and error.reported else ret


class Progress:
    """A line on stderr every PROGRESS_EVERY jobs of a big sweep (a 10,000-job sweep takes seconds to lay out)."""

    def __init__(self, total: int, what: str) -> None:
        self.total, self.what, self.done = total, what, 0
        self.start = time.perf_counter()

    def tick(self) -> None:
        self.done += 1
        if self.total >= PROGRESS_EVERY and (self.done % PROGRESS_EVERY == 0 or self.done == self.total):
            elapsed = time.perf_counter() - self.start
            print(f"hpc-train: {self.what} {self.done:,} of {self.total:,} jobs ({elapsed:.1f} s)", file=sys.stderr)


def _job_return(overrides: Sequence[str], run_dir: Path, value: Any) -> JobReturn:
    """A finished trial: COMPLETED with `value` (job id or objective), FAILED when `value` is an exception.

    It carries no config: a sweep of thousands of jobs keeps none in memory (sweepers read
    the return value and the status).
    """
    ret = JobReturn()
    ret.overrides = list(overrides)
    ret.working_dir = str(run_dir)
    ret.task_name = "hpc-train"
    ret.status = JobStatus.FAILED if isinstance(value, BaseException) else JobStatus.COMPLETED
    ret.return_value = value
    return ret
