"""Turn a planned job into a Slurm job with submitit: sbatch parameters, dry-run text, submission.

The layout (nodes, tasks per node, GPUs) comes from the strategy (`layout.py`); partition,
account, QoS, constraint, CPUs per GPU, hint, setup lines and extra options come from the
cluster profile. Jobs whose sbatch parameters are identical are submitted together as one
job array.
"""

from __future__ import annotations

import contextlib
import io
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

from hpc_train.config.errors import ConfigError
from hpc_train.launch.backends.slurm.params import check_partition, slurm_parameters, submitit_parameters, time_key
from hpc_train.launch.backends.slurm.queueing import CtrlC, Submission, SubmissionInterrupted
from hpc_train.launch.backends.slurm.refusals import refusal_error
from hpc_train.launch.backends.slurm.step import step_python
from hpc_train.launch.backends.slurm.submitit_import import submitit_module
from hpc_train.launch.planning import capacity
from hpc_train.launch.planning.plan import RunPlan
from hpc_train.launch.planning.sweep_limits import array_chunk
from hpc_train.records import rundir

SLURM_COMMANDS = ("sbatch", "srun")


@dataclass(frozen=True)
class SlurmWords:
    """How a refusal for want of Slurm names the launcher, its dry run and the local one: hpc-train's keys by default,
    a Hydra app's (hpc_train.launch.hydra.app_launcher) in theirs."""

    key: str = "launcher"
    slurm: str = "launcher=slurm"
    dry_run: str = "dry_run=true"
    local: str = "launcher=local to train here"

    def or_not_here(self) -> str:
        return f"add {self.dry_run} to only print the sbatch script, or use {self.local}."


def check_slurm_commands(words: SlurmWords = SlurmWords()) -> None:
    """Submitting needs Slurm's client commands and a configuration they read; without either say so before anything
    else happens (sbatch would fail in Slurm's terse words, after 60 s when SLURM_CONF names no file)."""
    missing = [name for name in SLURM_COMMANDS if shutil.which(name) is None]
    if missing:
        raise ConfigError(
            words.key,
            f"{words.slurm} submits a Slurm job, but {' and '.join(f'`{m}`' for m in missing)}"
            f" {'is' if len(missing) == 1 else 'are'} not on PATH on this machine.",
            f"run the command on a Slurm login node (or `module load slurm` first), {words.or_not_here()}",
        )
    sinfo = capacity.answer()  # the capacity check's own sinfo call, made once
    if sinfo.unconfigured:
        raise ConfigError(
            words.key,
            f"{words.slurm} submits a Slurm job, but Slurm's commands find no configuration on this machine"
            f" ({sinfo.why}).",
            "export SLURM_CONF=<your cluster's slurm.conf>, or unset a wrong SLURM_CONF (Slurm then reads its default"
            f" file or asks a configless controller); or {words.or_not_here()}",
        )


def make_executor(folder: Path, params: Dict[str, Any], max_requeues: int, array: bool = False):
    """submitit's Slurm executor for these parameters (it submits; ``render_sbatch`` shows the script): its batch
    script execs the batch-host agent, which starts the step (slurm_step.step_python); what the container needs is
    written now."""
    submitit = submitit_module()  # (~50 ms): only to submit; a dry run renders the script without it
    python = step_python(folder, params, array=array, stage=True)
    executor = submitit.SlurmExecutor(folder=str(folder), max_num_timeout=max_requeues, python=python)
    executor.update_parameters(**submitit_parameters(params))
    return executor


@dataclass
class PreparedJob:
    """One job ready for sbatch: its submitit parameters and what its tasks run.

    hpc-train's own jobs carry their plan and job spec (the tasks run ``TrainingJob(spec)``);
    a Hydra app's jobs (hpc_train.launch.hydra.app_launcher) carry no plan and their own ``payload``.
    """

    plan: Optional[RunPlan]
    spec: Optional[Dict[str, Any]]
    params: Dict[str, Any]
    label: str  # the overrides that make this job, for tables
    log_dir: Path  # where submitit's files go when the job is submitted alone (its run dir)
    max_requeues: int  # submitit's max_num_timeout
    payload: Any = None  # the callable its tasks run; None: made from spec by submit_jobs' `task`
    folder: Optional[Path] = None  # submitit's folder as the user gave it (a Hydra app's submitit_folder, %j and all)
    submitted_to: Optional[Path] = (
        None  # the folder submit_jobs gave submitit (for a rerun: hpc_train.launch.backends.rerun)
    )


def prepare(plan: RunPlan, spec: Dict[str, Any], label: str = "") -> PreparedJob:
    params = slurm_parameters(plan)
    if not plan.config.dry_run:
        check_slurm_commands()
    check_partition(params)
    capacity.check_capacity(params, time_key(plan.config))
    return PreparedJob(plan, spec, params, label, plan.run_dir, int(plan.config.trainer.max_requeues))


def _group_key(params: Dict[str, Any]) -> str:
    return repr(sorted(params.items()))


def _payload(job: PreparedJob, make_task: Callable[[Dict[str, Any]], Any]) -> Any:
    return job.payload if job.payload is not None else make_task(job.spec)  # type: ignore[arg-type]


def _chunks(members: List[PreparedJob], size: int) -> Iterator[List[PreparedJob]]:
    for start in range(0, len(members), size):
        yield members[start : start + size]


def submit_jobs(
    jobs: Sequence[PreparedJob], log_root: Optional[Path] = None, task: Optional[Callable[[Dict[str, Any]], Any]] = None
) -> List[Tuple[PreparedJob, Any]]:
    """Submit jobs; those sharing identical sbatch parameters go in as job arrays of at most MaxArraySize - 1 tasks.

    A single job logs into ``<run dir>/slurm``; an array logs into ``<log_root>/slurm``
    (the sweep dir), while every rank still writes ``logs/rank<r>.log`` in its own run dir.
    ``launcher.array_parallelism`` (or the profile's) throttles every array (``--array=0-N%P``)
    and chains the throttled arrays (``--dependency=afterany:<previous array>``), so the sweep
    as a whole runs at most P jobs at once; without it all of an array's tasks may run at once.
    Either all of it goes in or none: a refused sbatch raises ConfigError (see ``refusal_error``),
    Ctrl-C raises SubmissionInterrupted, each after cancelling what this call had queued and
    removing submitit's files (``Submission.take_back``).
    ``task`` makes what each Slurm task runs from a job spec (default: ``TrainingJob``).
    """
    from submitit.core.utils import FailedJobError  # submitit (~50 ms): only to submit, not for a dry run

    from hpc_train.compute.entry.job import TrainingJob  # compute side (imports submitit): only to submit

    make_task = task or TrainingJob
    arrays = _arrays(jobs)
    submission = Submission()
    submitted: List[Tuple[PreparedJob, Any]] = []
    previous_throttled: Optional[str] = None
    pressed = CtrlC()
    try:
        for number, members in enumerate(arrays, 1):
            pressed.take_effect()
            handles, previous_throttled = _submit_array(members, log_root, make_task, submission, previous_throttled)
            submitted.extend(zip(members, handles))
            if len(arrays) > 1 and len(members) > 1:
                print(
                    f"hpc-train: queued array {submission.queued[-1]} ({number} of {len(arrays)}, {len(members):,}"
                    " jobs)",
                    file=sys.stderr,
                    flush=True,
                )
        pressed.take_effect()  # during the last sbatch: the sweep goes in whole or not at all
    except (FailedJobError, OSError) as err:
        if pressed.count:  # the terminal's Ctrl-C reached the sbatch under way too, which then failed
            raise SubmissionInterrupted(submission.take_back(), len(jobs)) from None
        if isinstance(err, FailedJobError):
            submission.in_flight = 0  # sbatch answered no: it made no job to look for
        submission.take_back()
        raise refusal_error(str(err), submission.queued) from None
    except KeyboardInterrupt:  # Ctrl-C part-way: the sweep goes in whole or not at all, and the message says so
        raise SubmissionInterrupted(submission.take_back(), len(jobs)) from None
    except BaseException:
        submission.take_back()
        raise
    finally:
        pressed.restore()
    return submitted


def _arrays(jobs: Sequence[PreparedJob]) -> List[List[PreparedJob]]:
    """The jobs grouped by identical sbatch parameters, each group cut into arrays of at most MaxArraySize - 1 (a
    group of one: a single job)."""
    groups: Dict[str, List[PreparedJob]] = {}
    for job in jobs:
        groups.setdefault(_group_key(job.params), []).append(job)
    chunk = array_chunk() if any(len(members) > 1 for members in groups.values()) else 1
    return [part for members in groups.values() for part in _chunks(members, chunk)]


def _submit_array(
    members: List[PreparedJob],
    log_root: Optional[Path],
    make_task: Callable[[Dict[str, Any]], Any],
    submission: Submission,
    previous_throttled: Optional[str],
) -> Tuple[List[Any], Optional[str]]:
    """One array (or one job) through sbatch, watched by `submission`: its handles, and the throttled array the next
    throttled one waits for."""
    first, array = members[0], len(members) > 1
    folder = first.folder or ((log_root if (log_root is not None and array) else first.log_dir) / rundir.SLURM_LOGS)
    submission.watch(folder)
    params = _array_params(first.params, len(members), previous_throttled)
    executor = make_executor(folder, params, first.max_requeues, array=array)
    submission.sending(len(members))
    with contextlib.redirect_stderr(io.StringIO()):
        if not array:
            handles = [executor.submit(_payload(first, make_task))]
        else:
            with executor.batch():
                handles = [executor.submit(_payload(job, make_task)) for job in members]
    for job in members:
        job.submitted_to = folder
    submission.sent(str(handles[0].job_id).split("_")[0], len(members))
    throttled = "array_parallelism" in first.params
    return handles, submission.queued[-1] if throttled and array else previous_throttled


def _array_params(params: Dict[str, Any], size: int, previous_throttled: Optional[str]) -> Dict[str, Any]:
    """An array's parameters: throttled to launcher.array_parallelism when set (else all its `size` tasks may run at
    once), and a throttled array queued after the previous throttled one, so the sweep runs at most P jobs at once."""
    params = dict(params)
    throttled = "array_parallelism" in params
    params.setdefault("array_parallelism", size)  # submitit would throttle to 256 otherwise
    if throttled and size > 1 and previous_throttled:
        extra = dict(params.get("additional_parameters") or {})
        extra["dependency"] = ",".join(
            filter(None, [str(extra.get("dependency") or ""), f"afterany:{previous_throttled}"])
        )
        params["additional_parameters"] = extra
    return params


def submission_records(submitted: List[Tuple[PreparedJob, Any]], numbers: List[str]) -> List[Dict[str, Any]]:
    """What a rerun needs of each submitted job (hpc_train.jobs.submissions.record), `numbers` its job numbers."""
    return [
        {
            "job_id": str(handle.job_id),
            "job": number,
            "folder": str(job.submitted_to),
            "params": job.params,
            "max_requeues": job.max_requeues,
        }
        for (job, handle), number in zip(submitted, numbers)
    ]
