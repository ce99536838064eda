"""hpc_train's Python API: compose, run, submit and sweep jobs from Python, as `hpc-train` would.

``overrides`` are ``key=value`` strings exactly as on the command line; ``config_dir`` is what
``--config-dir`` is to the CLI (your own config groups, searched as the CLI searches them).

Decision: every job goes through the real CLI in a child process,
``python -m hpc_train.cli [--config-dir D] [-m] <overrides> hydra.run.dir=<run dir>``, rather than
calling the launcher in this process. Why:

* it is exactly what ``hpc-train`` does (composition, validation, layouts, launchers, sweeps,
  exit codes), with no second code path to drift;
* the launcher installs signal handlers, calls ``sys.exit`` and leaves Hydra's global state
  set; a notebook kernel or a user's script must not inherit any of that;
* the caller never imports torch (``import hpc_train`` stays login-node safe), and a local job's
  ranks are processes of their own either way.

The cost is one Python start per call (about a second). Only :func:`compose` works in this
process: it builds the config with Hydra's compose API over the search path the CLI uses. The
other functions compose first as well, which raises a composition error before any process
starts and tells them the launcher and the default run dir.

Errors: every one is an :class:`HpcTrainError`, of one family (hpc_train.errors). Bad input raises
:class:`ConfigError` with the message the CLI prints (composition errors are translated in-process by
``hydra_errors.translate``); a cluster that cannot be reached, :class:`Unreachable`; a run dir a live job
holds, :class:`RunDirRefused`; a record a full disk kept from being written, :class:`DiskFull`. Past
composition these come back from the CLI (its exit codes ``exits.REFUSED``) as data: the child writes its
refusal's family and key, problem and fix into ``hpc-train.result.json`` beside its output, and a rank's
refusal is read from the rank's error record; no printed line is parsed. A job that fails raises
:class:`JobFailed`, whose ``error`` is the one-line cause left by the rank that failed first
(``logs/rank<r>.error.json``), ``run_dir`` and ``logs`` where its records and logs are.

Run dirs: without ``run_dir`` (or a ``hydra.run.dir=`` override) a job gets the CLI's default,
``outputs/<date>/<time>`` under the current directory, made unique with a ``-1``, ``-2``...
suffix, because two calls in the same second would otherwise share a dir and the second would
resume the first's checkpoint. An explicit run dir is used as is (resume semantics, as with the
CLI). What the CLI prints goes to ``<run dir>/hpc-train.out`` (``<sweep dir>/hpc-train.out``). A dry
run's goes to a temporary file instead (shown, and returned by :func:`run`), so a dry run leaves no dir
behind and touches no file of a dir that was there; a call refused for bad input removes the dir it
made when nothing but that output and Hydra's own files is in it (the ConfigError carries the message).
In a run dir that was there (a finished run's, resumed), run() and submit() write what the CLI prints into
a hidden folder of the call's own there and move it over ``hpc-train.out`` once the call is not refused
(run(): when it ends; submit(): once the job started, its output going on in the same file), so a
refused call leaves that run's files as they were.

Local sweeps run in one background ``hpc-train -m`` process, their jobs one after another as
the CLI runs them; each job's :class:`Job` watches ``<sweep dir>/<n>``. Slurm sweeps return
once every job is queued, their ids read from ``<sweep dir>/jobs.tsv``; a packed sweep's
(``launcher.pack``) are packed ids, ``<allocation's job id>:<run>``, whose states come from the
allocations' own records (hpc_train.pack.status).
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Sequence, Union

from hpc_train import __all__ as _PUBLIC
from hpc_train.config import default_of
from hpc_train.config.launcher import DEFAULT_LAUNCHER, launcher_kind
from hpc_train.config.strategy import micro_batches
from hpc_train.errors import (  # noqa: F401 (the errors are the API's names too: __all__)
    ConfigError,
    DiskFull,
    HpcTrainError,
    JobFailed,
    RunDirRefused,
    Unreachable,
)
from hpc_train.jobs import job_states as states
from hpc_train.jobs import job_table
from hpc_train.jobs.job_states import ENDED
from hpc_train.jobs.submissions import newest_submission
from hpc_train.launch.backends.base import JobRef
from hpc_train.launch.backends.registry import backend_for
from hpc_train.launch.backends.remote_watch import RemoteWatch
from hpc_train.launch.backends.slurm.follow import Follower
from hpc_train.launch.hydra import cli_child as child
from hpc_train.launch.hydra.cli_child import OUTPUT_NAME, PathLike
from hpc_train.launch.hydra.exits import REFUSED  # the CLI's exit codes of a refusal: nothing ran
from hpc_train.pack.records import is_packed_id
from hpc_train.pack.status import SharedPackedStates
from hpc_train.records import rundir
from hpc_train.remote.settings import read_link

if TYPE_CHECKING:
    from omegaconf import DictConfig

UNKNOWN_GRACE_S = 60.0  # a Slurm job neither squeue nor sacct knows for this long is gone


# -- composing --------------------------------------------------------------------------------
def _compose(overrides: List[str], config_dir: Optional[PathLike]) -> Any:
    """``cli_child.compose`` with hpc_train's Hydra plugin registered first, as the CLI registers it."""
    # hpc_train's Hydra plugin (its launchers and sweeper in Hydra's ConfigStore; Hydra ~0.2 s): only when composing
    import hydra_plugins.hpc_train_launcher as plugin

    plugin.register()
    return child.compose(overrides, config_dir)


def compose(overrides: Sequence[str] = (), config_dir: Optional[PathLike] = None) -> "DictConfig":
    """The job config `hpc-train <overrides>` would run, interpolations resolved; nothing runs.

    The same as ``hpc-train --cfg job --resolve``. Bad input raises ConfigError with the CLI's message.
    """
    cfg, _ = _compose(child.checked(overrides), config_dir)
    return cfg


# -- running the CLI --------------------------------------------------------------------------


# -- jobs -------------------------------------------------------------------------------------
class Job:
    """A submitted job: local (a background hpc-train process) or Slurm (a job id).

    ``state()`` speaks Slurm's state names for both: PENDING, RUNNING, COMPLETED, FAILED,
    CANCELLED, TIMEOUT, ... A local job stopped by a signal after its checkpoint is CANCELLED
    (run the same overrides with the same run dir to resume it). A run of a packed sweep (its id
    ``<allocation>:<run>``) has its allocation's words: WAITING (in its allocation, not started),
    RUNNING, COMPLETED, FAILED, INTERRUPTED (its allocation requeued), CANCELLED; it follows its
    run, into the new allocation of a ``--rerun-failed``. Its launcher's backend watches it
    (hpc_train.launch.backends).
    """

    def __init__(
        self,
        job_id: str,
        run_dir: Path,
        launcher: str = DEFAULT_LAUNCHER,
        overrides: Sequence[str] = (),
        *,
        process: Optional[subprocess.Popen] = None,
        output: Optional[Path] = None,
        started: Optional[float] = None,
        next_run_dir: Optional[Path] = None,
        sweep_index: Optional[int] = None,
        shared_states: Optional[Union[states.SharedStates, SharedPackedStates]] = None,
    ) -> None:
        self.job_id = str(job_id)
        self.run_dir = Path(run_dir)
        self.launcher = launcher  # the name, as data (repr); what it means is its backend's
        self.overrides = list(overrides)
        self._output = output  # what the hpc-train process printed
        self._started = time.time() if started is None else started
        self._unknown_since: Optional[float] = None
        ref = JobRef(self.job_id, self.run_dir, process, sweep_index, next_run_dir, shared_states)
        self._watch = backend_for(launcher).watch(ref)
        link = read_link(self.run_dir) if process is None else None
        if link is not None:  # submitted from this machine to a cluster (cluster.login): followed over SSH
            self._watch = RemoteWatch(self._watch, link)
        # A Slurm job is waited for by launcher.wait's follower: the same lines (a requeue), the same end
        self._follower = (
            Follower(self.job_id, self.run_dir, self._started, look=self._slurm_state)
            if launcher_kind(launcher).submits and not is_packed_id(self.job_id)
            else None
        )
        self._last_state = "PENDING"

    def __repr__(self) -> str:
        return f"Job(job_id={self.job_id!r}, run_dir={str(self.run_dir)!r}, launcher={self.launcher!r})"

    def summary(self) -> Optional[Dict[str, Any]]:
        """The job's summary.json as a dict, or None while there is none."""
        if isinstance(self._watch, RemoteWatch):
            self._watch.refresh()
        return states.read_summary(self.run_dir)

    def state(self) -> str:
        return self._watch.state()

    def cancel(self) -> None:
        """Stop the job: ``scancel`` on Slurm; locally SIGTERM to hpc-train, whose ranks checkpoint and stop.

        The jobs of a local sweep share one process: cancelling one stops the sweep. A packed run shares its
        allocation with other runs: cancelling one raises ValueError (scancel the allocation to stop them all).
        """
        self._watch.cancel()

    def wait(self, timeout: Optional[float] = None) -> Dict[str, Any]:
        """Block until the job ends; return its summary.

        A Slurm job is followed as ``launcher.wait`` follows it (hpc_train.launch.backends.slurm.follow): a requeue
        is said in the same line, and from a laptop a dropped connection is opened again. Raises JobFailed when it
        did not complete, ConfigError when hpc-train refused its input, TimeoutError when it is still going after
        `timeout` seconds (the job keeps going).
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            state = self._ended()
            if state is not None:
                return self._result(state)
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(
                    f"job {self.job_id} is still {self._last_state} after {timeout} s (run dir {self.run_dir})"
                )
            pause = self._watch.poll_s
            if deadline is not None:
                pause = max(0.0, min(pause, deadline - time.monotonic()))
            time.sleep(pause)

    def _ended(self) -> Optional[str]:
        """One look: the job's final state once it ended, None while it goes on."""
        if self._follower is not None:
            ending = self._watch.on_cluster(self._follower.poll)
            self._last_state = self._follower.last_state or self._last_state
            if ending is None:
                return None
            if ending.state is None:
                raise JobFailed(
                    f"Slurm job {self.job_id}: {ending.detail}, and it left no summary in {self.run_dir}",
                    error=self._error(),
                    **self._records(),
                )
            return ending.state
        state = self._last_state = self.state()
        if state in ENDED:
            return state
        if state != "UNKNOWN":
            self._unknown_since = None
            return None
        self._unknown_since = self._unknown_since or time.monotonic()
        if time.monotonic() - self._unknown_since > UNKNOWN_GRACE_S:
            raise JobFailed(
                f"job {self.job_id}: nothing says it is running any more, and it left no summary in {self.run_dir}",
                error=self._error(),
                **self._records(),
            )
        return None

    def _slurm_state(self) -> Optional[states.SlurmState]:
        """The follower's look: the job's watch (a sweep's jobs read together; a laptop's over SSH)."""
        state = self._watch.state()
        return None if state == "UNKNOWN" else states.SlurmState(state)

    def _result(self, state: str) -> Dict[str, Any]:
        summary = self.summary()
        own_command = self._watch.command_is_the_job
        if state == "COMPLETED":
            if summary is not None:
                return summary
            if own_command:  # a dry run, or a plain sbatch script's step: nothing trained
                return {}
        code = self._watch.exit_code()
        if own_command and code in REFUSED and self._output is not None:
            raise child.bad_input(self._output, self.run_dir, self._started)
        rank, error = states.first_rank_error(self.run_dir, self._started)
        cause = f": rank {rank} failed first ({error})" if error else ""
        where = (
            f"; its traceback: {rundir.rank_log(self.run_dir, rank)}"
            if error
            else f"; see {self.run_dir / rundir.LOGS}"
        )
        if state == "COMPLETED":
            cause = " without writing summary.json"
        printed = f" and {self._output}" if self._output is not None else ""
        raise JobFailed(
            f"job {self.job_id} {state}{cause}{where}{printed}",
            exit_code=code if code not in (None, 0) else 1,
            error=error,
            **self._records(),
        )

    def _records(self) -> Dict[str, Path]:
        """What a JobFailed of this job carries: its run dir (its records) and the folder of its logs."""
        return {"run_dir": self.run_dir, "logs": self.run_dir / rundir.LOGS}

    def _error(self) -> Optional[str]:
        return states.first_rank_error(self.run_dir, self._started)[1]


# -- run, submit, sweep -----------------------------------------------------------------------
def run(
    overrides: Sequence[str] = (),
    config_dir: Optional[PathLike] = None,
    run_dir: Optional[PathLike] = None,
    *,
    quiet: bool = False,
) -> Dict[str, Any]:
    """Run the job as `hpc-train <overrides>` would, wait for it, return its summary (summary.json).

    The launcher comes from the overrides (local by default); a Slurm job is followed to its
    end (``launcher.wait=true``). What hpc-train prints is shown here (``quiet=True``: only in
    ``<run dir>/hpc-train.out``). With ``dry_run=true`` nothing runs and the result is
    ``{"dry_run": True, "run_dir": ..., "output": <what was printed, e.g. the sbatch script>}``, ``run_dir`` the dir
    the job would get: a dry run leaves no dir behind and writes no ``hpc-train.out`` (a dir that was there stays as
    it was). Raises ConfigError for bad input (the run dir this call made is removed again when the refusal left
    nothing but what was printed and Hydra's own files in it), JobFailed when the job fails.
    """
    overrides = child.checked(overrides)
    cfg, dirs = _compose(overrides, config_dir)
    own = child.reserve(run_dir, overrides, "hydra.run.dir", dirs["run"])
    target = own.path
    kind = launcher_kind(cfg.launcher.name)
    extra = [f"hydra.run.dir={child.path_value(target)}"] + (["launcher.wait=true"] if kind.submits else [])
    started = time.time()
    with own.output(bool(cfg.dry_run)) as output:  # a dry run's: nothing behind, nothing of an earlier run touched
        code, out, _ = child.foreground(child.cli_command(overrides, config_dir) + extra, output, echo=not quiet)
        if code in REFUSED:
            raise own.refused(child.bad_input(output, target, started))
    if (
        code == 0 and cfg.dry_run
    ):  # the output names the run dir the job would have had (an earlier run's summary: not this)
        return {"dry_run": True, "run_dir": str(target), "output": out}
    summary = states.read_summary(target)
    if code == 0 and summary is not None:
        return summary
    if code == 0 and kind.prepares_only:
        return {"dry_run": False, "run_dir": str(target), "output": out}
    rank, error = states.first_rank_error(target, started)
    submitted = newest_submission(target) if kind.submits else None
    what = f"Slurm job {submitted['job_id']}" if submitted else "the job"
    cause = (
        f": rank {rank} failed first ({error})"
        if error
        else (" without writing summary.json" if code == 0 else f" (exit code {code})")
    )
    raise JobFailed(
        f"{what} in {target} failed{cause}; see {target / 'logs'} and {target / OUTPUT_NAME}",
        exit_code=code or 1,
        error=error,
        run_dir=target,
        logs=target / rundir.LOGS,
    )


def submit(
    overrides: Sequence[str] = (), config_dir: Optional[PathLike] = None, run_dir: Optional[PathLike] = None
) -> Job:
    """Start the job and return at once: locally a background hpc-train process, on Slurm once it is queued.

    A local job returns as soon as it has passed validation and its ranks are starting (a few
    seconds); bad input raises ConfigError here (and the run dir made for the call is removed again, as by
    :func:`run`). Its output goes to ``<run dir>/hpc-train.out``. ``dry_run=true`` raises ConfigError (key
    ``dry_run``) before anything is made: a dry run starts no job to return; :func:`run` does dry runs.
    """
    overrides = child.checked(overrides)
    cfg, dirs = _compose(overrides, config_dir)
    if cfg.dry_run:  # before any dir is reserved: a dry run starts no job to return
        raise ConfigError(
            "dry_run",
            "submit() starts a job and returns it; a dry run starts none.",
            "call hpc_train.run([..., 'dry_run=true']) to see what would run (it returns what hpc-train prints).",
        )
    own = child.reserve(run_dir, overrides, "hydra.run.dir", dirs["run"])
    target = own.path
    command = child.cli_command(overrides, config_dir) + [f"hydra.run.dir={child.path_value(target)}"]
    started = time.time()
    with own.output(dry_run=False) as output:  # in a run dir that was there: moved into place unless refused
        job = _start(command, own, str(cfg.launcher.name), overrides, output, started)
    return job


def _start(
    command: List[str], own: child.OwnDir, launcher: str, overrides: List[str], output: Path, started: float
) -> Job:
    """submit()'s job started: queued on Slurm (its id read from the run dir's submissions), or a local process."""
    target, printed = own.path, own.path / OUTPUT_NAME  # `output` is there once the call was not refused
    if launcher_kind(launcher).submits:
        code, _, _ = child.foreground(command + ["launcher.wait=false"], output, echo=False)
        if code in REFUSED:
            raise own.refused(child.bad_input(output))
        submitted = newest_submission(target)
        if code != 0 or submitted is None:
            raise JobFailed(f"hpc-train did not queue the job (exit code {code}); see {printed}", exit_code=code or 1)
        return Job(str(submitted["job_id"]), target, launcher, overrides, output=printed, started=started)
    process = child.background(command, output)
    child.wait_for_start(process, [target / rundir.JOB_CONFIG], started)
    if process.poll() in REFUSED:
        raise own.refused(child.bad_input(output, target, started))
    return Job(f"local-{process.pid}", target, launcher, overrides, process=process, output=printed, started=started)


def sweep(
    overrides: Sequence[str] = (), config_dir: Optional[PathLike] = None, sweep_dir: Optional[PathLike] = None
) -> List[Job]:
    """A multirun (`hpc-train -m <overrides>`): one Job per job of the sweep, in Hydra's job order.

    Slurm: returns once every job is queued (ids from ``<sweep dir>/jobs.tsv``). Local: the sweep
    runs in one background process, jobs one after another in ``<sweep dir>/<n>``; returns once
    the first job has started. All jobs must use the same launcher. With a sweeper that
    optimises (``hydra/sweeper=optuna``...), the number of jobs is not known in advance:
    sweep() then returns when the study has ended. With ``dry_run=true`` nothing runs: what
    hpc-train prints (each job's layout, run dir, sbatch script) is shown here, the result is
    ``[]`` and no sweep dir is left behind (one that was there stays as it was).
    """
    overrides = child.checked(overrides)
    jobs = child.expand(overrides)
    cfg, dirs = _compose(jobs[0], config_dir)
    own = child.reserve(sweep_dir, overrides, "hydra.sweep.dir", dirs["sweep"])
    launchers = {child.launcher_of(job, str(cfg.launcher.name)) for job in jobs}
    if len(launchers) > 1:
        raise ConfigError(
            "launcher",
            f"this sweep mixes launchers ({', '.join(sorted(launchers))}); sweep() follows one kind of job.",
            "sweep the local and the Slurm jobs in two sweep() calls.",
        )
    launcher = launchers.pop()
    command = child.cli_command(overrides, config_dir, multirun=True) + [
        f"hydra.sweep.dir={child.path_value(own.path)}"
    ]
    if cfg.dry_run:
        return _dry_sweep(command, own)
    if launcher_kind(launcher).submits:
        return _queued_sweep(command, own, launcher)
    optimising = any(
        o.split("=", 1)[0].lstrip("+") == "hydra/sweeper" and o.split("=", 1)[1] != "hpc_train" for o in overrides
    )
    return _local_sweep(command, own, launcher, None if optimising else jobs)


def _dry_sweep(command: List[str], own: child.OwnDir) -> List[Job]:
    """A sweep's dry run, in the foreground: what it prints shown here, nothing left behind; no jobs."""
    with own.output(dry_run=True) as output:
        code, _, _ = child.foreground(command, output, echo=True)
        if code in REFUSED:
            raise child.bad_input(output)
    if code != 0:
        raise JobFailed(
            f"the dry run of the sweep failed (exit code {code}); see what it printed above", exit_code=code
        )
    return []


def _queued_sweep(command: List[str], own: child.OwnDir, launcher: str) -> List[Job]:
    """A Slurm sweep: one Job per job queued (read from the sweep's job table)."""
    target = own.path
    output = target / OUTPUT_NAME
    started = time.time()
    known = job_table.read(target)
    code, _, _ = child.foreground(command, output, echo=False)
    if code in REFUSED:
        raise own.refused(child.bad_input(output))
    rows = job_table.read(target)[len(known) :]
    if code != 0 and not rows:
        raise JobFailed(f"hpc-train -m did not queue the sweep (exit code {code}); see {output}", exit_code=code)
    run_dirs = {row.job_id: target / row.job for row in rows if not is_packed_id(row.job_id)}
    shared = states.SharedStates(list(run_dirs), run_dirs=run_dirs)
    packed = SharedPackedStates(target)  # read only when a packed run's state is asked
    return [
        Job(
            row.job_id,
            target / row.job,
            launcher,
            child.overrides_of(target / row.job, row.overrides.split()),
            output=output,
            started=started,
            shared_states=packed if is_packed_id(row.job_id) else shared,
        )
        for row in rows
    ]


def _local_sweep(command: List[str], own: child.OwnDir, launcher: str, jobs: Optional[List[List[str]]]) -> List[Job]:
    """A local sweep in one background process: one Job per job, returned once the first has started (`jobs`: each
    job's overrides; None: an optimising sweeper decides, and its study is waited for)."""
    target = own.path
    output = target / OUTPUT_NAME
    started = time.time()
    process = child.background(command, output)
    if jobs is None:  # the sweeper decides how many jobs there are: wait for it
        process.wait()
        numbers = sorted(int(p.name) for p in target.iterdir() if p.name.isdigit() and (p / ".hydra").exists())
        jobs = [child.overrides_of(target / str(n), []) for n in numbers]
    else:
        numbers = list(range(len(jobs)))
        child.wait_for_start(process, [target / "0" / ".hydra" / "overrides.yaml"], started)
    if process.poll() in REFUSED and not any((target / str(n) / ".hydra").exists() for n in numbers):
        raise own.refused(child.bad_input(output))
    return [
        Job(
            f"local-{process.pid}_{n}",
            target / str(n),
            launcher,
            job,
            process=process,
            output=output,
            started=started,
            next_run_dir=target / str(n + 1),
            sweep_index=n,
        )
        for n, job in zip(numbers, jobs)
    ]


# -- in-process staging -----------------------------------------------------------------------
def staged_model(
    model: Any,
    devices: Optional[Sequence[Any]] = None,
    stages: Optional[int] = None,
    chunks: Optional[int] = None,
    balance: Union[str, Sequence[int]] = default_of("strategy.balance"),
    split_points: Optional[Sequence[str]] = None,
    batchnorm: str = default_of("strategy.batchnorm"),
    example: Any = None,
) -> Any:
    """`model` cut into consecutive stages exactly as ``strategy=model_parallel`` (chunks=1) or ``pipeline`` builds it.

    For timing or inspecting a split in this process (the demo notebook does). Arguments
    mirror the strategy's keys: ``stages`` (default: one per device, or ``len(split_points) + 1``),
    ``chunks`` (micro-batches per batch; None: one), ``balance`` (``params``, ``time`` with an ``example``
    batch, or layer counts), ``split_points`` (module names where a stage begins) and
    ``batchnorm`` (``keep`` or ``freeze``). ``devices``: torch devices or names, stage s on
    ``devices[s % len(devices)]``; default: the visible GPUs (wrapping around when there are
    fewer than stages), else the CPU, as a training task would place them. Returns an
    ``nn.Module`` with ``.stages``, ``.devices``, ``.output_device``; feed it inputs on
    ``devices[0]``. Imports torch: not for the login node.
    """
    # torch: only this function needs it (the rest of the API runs on a login node)
    import torch

    from hpc_train.compute.parallel.staged_model import build_staged

    points = [str(p) for p in split_points or []]
    if points and stages is not None and stages != len(points) + 1:
        raise ValueError(f"stages={stages} disagrees with split_points={points} ({len(points) + 1} stages)")
    if devices is None:
        wanted = stages or (len(points) + 1 if points else max(1, torch.cuda.device_count()))
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        devices = [torch.device("cuda", i % count) for i in range(wanted)] if count else [torch.device("cpu")] * wanted
    devices = [torch.device(d) for d in devices]
    stages = stages or (len(points) + 1 if points else len(devices))
    balance = balance if isinstance(balance, str) else [int(b) for b in balance]
    return build_staged(
        model,
        devices,
        stages,
        balance,
        micro_batches(chunks),
        freeze_batchnorm=batchnorm == "freeze",
        example=example,
        split_points=points or None,
    )


# The front door's names (hpc_train/__init__.py, the one list) that this module holds.
__all__ = [name for name in _PUBLIC if name in globals()]
