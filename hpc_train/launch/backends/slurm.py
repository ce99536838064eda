"""Turn a planned job into a Slurm job with submitit: sbatch parameters, dry-run text, submission.

The layout (nodes, tasks per node, GPUs) comes from the strategy (`layout.py`); partition,
account, QoS, constraint, CPUs per GPU, hint, setup lines and extra options come from the
cluster profile. Jobs whose sbatch parameters are identical are submitted together as one
job array.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import shlex
import shutil
import signal
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

from hpc_train.config.checks import count_range
from hpc_train.config.errors import ConfigError
from hpc_train.config.launcher import signal_name
from hpc_train.config.view import ConfigView, plain
from hpc_train.launch.backends.submitit_import import submitit_module
from hpc_train.launch.planning import capacity
from hpc_train.launch.planning.errors import Interrupted
from hpc_train.launch.planning.layout import JobLayout
from hpc_train.launch.planning.plan import RunPlan
from hpc_train.launch.planning.sweep_limits import array_chunk
from hpc_train.processes.rank_env import unset_line
from hpc_train.records import rundir
from hpc_train.slurm import slurm_cli
from hpc_train.slurm.slurm_time import limit_minutes

_UNSAFE_SETUP = re.compile(r"[\n\r;&|`]|\$\(")


def time_minutes(value: Any, key: str = "resources.time") -> int:
    """A time limit (minutes, or a Slurm duration such as HH:MM:SS or D-HH:MM:SS) -> whole minutes, rounded up."""
    try:
        return limit_minutes(value)
    except ValueError:
        raise ConfigError(
            key,
            f"{value!r} is not a positive Slurm time.",
            f"use minutes or HH:MM:SS, e.g. {key}=02:00:00.",
        ) from None


def time_key(cfg: ConfigView) -> str:
    """The key the job's time limit comes from (resources.time overrides the profile's)."""
    return "resources.time" if cfg.resources.time is not None else "cluster.time"


def cluster_account(cluster: ConfigView) -> Optional[str]:
    if cluster.get("account"):
        return str(cluster.account)
    env_name = cluster.get("account_env")
    if not env_name:
        return None
    value = os.environ.get(str(env_name))
    if not value:
        raise ConfigError(
            "cluster.account",
            f"the {cluster.name} profile reads the account from ${env_name}, which is not set.",
            f"export {env_name}=<your project> or pass cluster.account=<account>.",
        )
    return value + str(cluster.get("account_suffix") or "")


def cluster_qos(cluster: ConfigView, minutes: int) -> Optional[str]:
    if cluster.get("qos"):
        return str(cluster.qos)
    table = cluster.get("qos_by_time") or []
    for row in table:
        if minutes <= int(row.max_minutes):
            return str(row.qos)
    if table:
        longest = max(int(r.max_minutes) for r in table)
        raise ConfigError(
            "resources.time",
            f"{minutes} minutes is longer than any QoS of the {cluster.name} profile allows ({longest} minutes).",
            f"ask for at most {longest} minutes, or pass cluster.qos=<qos> explicitly.",
        )
    return None


def check_safe_text(cfg: ConfigView) -> None:
    """Setup lines are shell, one command each; job names are flags: refuse anything that would run as extra shell."""
    if not re.fullmatch(r"[A-Za-z0-9_.+-]+", str(cfg.job_name)):
        raise ConfigError(
            "job_name",
            f"{cfg.job_name!r} has characters Slurm job names should not have (spaces, quotes, ';', newlines...).",
            "use letters, digits, '.', '_', '+' or '-', e.g. job_name=resnet-ddp.",
        )
    for index, line in enumerate(cfg.cluster.get("setup") or []):
        text = str(line)
        problem = None
        if _UNSAFE_SETUP.search(text):
            problem = "contains a newline, ';', '&', '|', a backtick or '$(', which would run extra commands"
        else:
            try:
                shlex.split(text)
            except ValueError:
                problem = "has unbalanced quotes"
        if problem:
            raise ConfigError(
                f"cluster.setup[{index}]",
                f"the setup line {text!r} {problem}.",
                "give one plain command per list entry, e.g. cluster.setup='[module purge,module load pytorch-gpu]'.",
            )


def slurm_parameters(plan: RunPlan) -> Dict[str, Any]:
    """submitit SlurmExecutor parameters for this job (everything but the log folder)."""
    cfg = plan.config
    cluster, layout = cfg.cluster, plan.layout
    check_safe_text(cfg)
    minutes = time_minutes(cfg.resources.time if cfg.resources.time is not None else cluster.time, time_key(cfg))
    params: Dict[str, Any] = {
        "job_name": str(cfg.job_name),
        "nodes": layout.nodes,
        "ntasks_per_node": layout.tasks_per_node,
        "cpus_per_task": layout.cpus_per_task,
        "time": minutes,
        "signal_delay_s": int(cfg.launcher.signal_delay_s),
        "stderr_to_stdout": False,
        "setup": [str(line) for line in cluster.get("setup") or []],
        # One failing task ends the whole step at once instead of leaving the others blocked
        # in a collective until the process-group timeout.
        "srun_args": ["--kill-on-bad-exit=1"],
    }
    # Both sides told, whatever the signal: a SUBMITIT_PREEMPT_SIGNAL left in the login shell would otherwise set
    # the #SBATCH --signal and submitit's handler in the job to another signal than the trainer's.
    signal_name = requeue_signal(cfg)
    params["setup"] = [unset_line(), f"export SUBMITIT_PREEMPT_SIGNAL={signal_name}", *params["setup"]]
    if str(cluster.gpu_flag) == "gres":  # the declaration allows gres or gpus-per-node
        params["gres"] = f"gpu:{layout.gpus_per_node}"
    else:
        params["gpus_per_node"] = layout.gpus_per_node
    optional = {
        "partition": cluster.get("partition"),
        "account": cluster_account(cluster),
        "qos": cluster_qos(cluster, minutes),
        "constraint": cluster.get("constraint"),
        "mem": f"{int(cluster.mem_gb)}GB" if cluster.get("mem_gb") else None,
    }
    params.update({k: str(v) for k, v in optional.items() if v})
    extra = plain(cluster.get("extra") or {})
    if cluster.get("hint"):
        extra = {"hint": str(cluster.hint), **extra}
    # Requeueable whatever the site default (JobRequeue=0 would refuse `scontrol requeue`).
    extra = {"requeue": True, **extra}
    extra["signal"] = f"{signal_name}@{int(cfg.launcher.signal_delay_s)}"
    params["additional_parameters"] = extra
    throttle = cfg.launcher.get("array_parallelism") or cluster.get("array_parallelism")
    if throttle:
        params["array_parallelism"] = int(throttle)  # submitit: --array=0-N%P when jobs go in as an array
    return node_range_parameters(params, layout) if layout.max_nodes else params


def node_range_parameters(params: Dict[str, Any], layout: JobLayout) -> Dict[str, Any]:
    """A range of nodes (resources.nodes=2-4): ``--nodes=2-4`` and each node's CPUs as one batch task's, the tasks
    per node given to srun (``--ntasks-per-node``, ``--cpus-per-task``), so the world is the nodes Slurm gave x the
    tasks per node.

    Not sbatch's ``--ntasks-per-node``: given it, sbatch sets the job's task count to the range's least x the tasks
    per node, and a node cannot join a job without a task of it, so Slurm allocates the least count whatever is free
    (measured on Slurm 22.05; see docs/architecture.md, Decisions).
    """
    ranged = {key: value for key, value in params.items() if key != "ntasks_per_node"}
    ranged["nodes"] = layout.nodes_text
    ranged["cpus_per_task"] = layout.cpus_per_task * layout.tasks_per_node  # the node's share: every task's CPUs
    per_node = [f"--ntasks-per-node={layout.tasks_per_node}", f"--cpus-per-task={layout.cpus_per_task}"]
    ranged["srun_args"] = [*per_node, *params["srun_args"]]
    return ranged


def requeue_signal(cfg: ConfigView) -> str:
    """launcher.signal (checked by its declaration: USR1 or USR2, with or without SIG) as Slurm spells it."""
    return signal_name(cfg.launcher.signal)


def check_partition(params: Dict[str, Any], key: str = "cluster.partition") -> None:
    """When sinfo answers, refuse a partition the cluster does not have (`key` names where it was set)."""
    partition = params.get("partition")
    found = capacity.partitions() if partition else None
    if not found:
        return
    known = sorted(found)
    missing = [name for name in str(partition).split(",") if name not in found]
    if missing:
        raise ConfigError(
            key,
            f"this cluster has no partition {missing[0]!r} (sinfo lists: {', '.join(known)}).",
            f"pass {key}=<one of {', '.join(known)}>.",
        )


SLURM_COMMANDS = ("sbatch", "srun")


_OR_NOT_HERE = "add dry_run=true to only print the sbatch script, or use launcher=local to train here."


def check_slurm_commands() -> None:
    """Submitting needs Slurm's client commands and a configuration they read; without either say so before anything
    else happens (sbatch would fail in Slurm's terse words, after 60 s when SLURM_CONF names no file)."""
    missing = [name for name in SLURM_COMMANDS if shutil.which(name) is None]
    if missing:
        raise ConfigError(
            "launcher",
            f"launcher=slurm submits a Slurm job, but {' and '.join(f'`{m}`' for m in missing)}"
            f" {'is' if len(missing) == 1 else 'are'} not on PATH on this machine.",
            f"run the command on a Slurm login node (or `module load slurm` first), {_OR_NOT_HERE}",
        )
    sinfo = capacity.answer()  # the capacity check's own sinfo call, made once
    if sinfo.unconfigured:
        raise ConfigError(
            "launcher",
            f"launcher=slurm submits a Slurm job, but Slurm's commands find no configuration on this machine"
            f" ({sinfo.why}).",
            "export SLURM_CONF=<your cluster's slurm.conf>, or unset a wrong SLURM_CONF (Slurm then reads its default"
            f" file or asks a configless controller); or {_OR_NOT_HERE}",
        )


def make_executor(folder: Path, params: Dict[str, Any], max_requeues: int):
    """submitit's Slurm executor for these parameters (it submits; ``render_sbatch`` shows the script)."""
    submitit = submitit_module()  # (~50 ms): only to submit; a dry run renders the script without it
    executor = submitit.SlurmExecutor(folder=str(folder), max_num_timeout=max_requeues)
    executor.update_parameters(**submitit_parameters(params))
    return executor


def submitit_parameters(params: Dict[str, Any]) -> Dict[str, Any]:
    """`params` as submitit takes them: a range of nodes (``2-4``) goes in as the ``--nodes`` sbatch option.

    submitit multiplies ``nodes`` by the tasks per node to number the job's tasks (its results), so it is given the
    range's least, whose tasks every allocation has, and its additional parameters write ``--nodes=2-4`` in place of
    that line: the script is the one ``render_sbatch`` shows.
    """
    nodes = params.get("nodes")
    if not isinstance(nodes, str):
        return params
    least, _ = count_range(nodes)
    extra = {**(params.get("additional_parameters") or {}), "nodes": nodes}
    return {**params, "nodes": least, "additional_parameters": extra}


# The submitit parameters slurm_parameters() produces that become `#SBATCH --<key>=<value>` lines.
_SBATCH_KEYS = frozenset(
    "job_name nodes ntasks_per_node cpus_per_task time gres gpus_per_node partition account qos constraint mem".split()
)
# Those that shape the rest of the script (array_parallelism matters only to arrays, which are not rendered).
_SCRIPT_KEYS = frozenset(
    "setup signal_delay_s stderr_to_stdout srun_args additional_parameters array_parallelism".split()
)
# submitit's defaults that it writes as #SBATCH lines when not given.
_SUBMITIT_DEFAULTS = {"job_name": "submitit", "time": 5, "nodes": 1, "wckey": "submitit"}


def sbatch_flag(key: str, value: Any) -> str:
    key = key.replace("_", "-")
    return f"#SBATCH --{key}" if value is True else f"#SBATCH --{key}={shlex.quote(str(value))}"


def render_sbatch(folder: Path, params: Dict[str, Any]) -> str:
    """The sbatch script submitit submits for one job with these parameters (nothing is submitted).

    hpc_train renders it itself: submitit has no public way to render its script without
    submitting (only private methods), so hpc_train owns this text, line for line what submitit
    1.5 writes into ``<folder>/<job id>_submission.sh`` (its ``%j_%t_log.out/.err`` log names,
    its ``--signal``, wckey and ``open-mode``, its ``srun ... -m submitit.core._submit <folder>``
    command). Submission itself still goes through submitit's executor; a test compares this text
    with the file submitit writes, so a submitit upgrade that changes its script fails there.
    """
    unknown = sorted(set(params) - _SBATCH_KEYS - _SCRIPT_KEYS)
    if unknown:
        raise ValueError(f"render_sbatch does not know the submitit parameter(s) {unknown}")
    folder = Path(folder).expanduser().absolute()
    stdout, stderr = str(folder / "%j_%t_log.out"), str(folder / "%j_%t_log.err")
    options: Dict[str, Any] = {**_SUBMITIT_DEFAULTS}
    options.update({key: value for key, value in params.items() if key in _SBATCH_KEYS and value is not None})
    # submitit's preemption signal (SUBMITIT_PREEMPT_SIGNAL, else USR2): submitit reads it too;
    # slurm_parameters overrides it through additional_parameters for any other signal.
    preempt = os.environ.get("SUBMITIT_PREEMPT_SIGNAL", "USR2")
    options["signal"] = f"{preempt}@{params.get('signal_delay_s', 90)}"
    options["output"] = stdout.replace("%t", "0")
    if not params.get("stderr_to_stdout"):
        options["error"] = stderr.replace("%t", "0")
    options["open-mode"] = "append"
    options.update(params.get("additional_parameters") or {})
    lines = ["#!/bin/bash", "", "# Parameters", *(sbatch_flag(key, options[key]) for key in sorted(options))]
    if params.get("setup") is not None:
        lines += ["", "# setup", *params["setup"]]
    error = [] if params.get("stderr_to_stdout") else ["--error", stderr]
    srun = ["srun", "--unbuffered", "--output", stdout, *error, *(params.get("srun_args") or [])]
    command = f"{shlex.quote(sys.executable)} -u -m submitit.core._submit {shlex.quote(str(folder))}"
    lines += ["", "# command", "export SUBMITIT_EXECUTOR=slurm", " ".join(map(shlex.quote, srun)) + " " + command, ""]
    return "\n".join(lines)


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


# Slurm's words for a refused submission -> the key to change and how (first match wins).
_REFUSALS = (
    (
        "cpu count per node",
        "cluster.cpus_per_gpu",
        (
            "lower cluster.cpus_per_gpu (or resources.gpus_per_node) to what the partition's nodes have (`sinfo -N -o"
            " '%N %c %G %m'`)."
        ),
    ),
    (
        "memory specification",
        "cluster.mem_gb",
        "lower cluster.mem_gb, or set cluster.mem_gb=null for the partition's default.",
    ),
    ("invalid partition", "cluster.partition", "pass cluster.partition=<a partition `sinfo` lists>."),
    ("invalid account", "cluster.account", "pass cluster.account=<an account `sacctmgr show assoc user=$USER` lists>."),
    (
        "invalid qos",
        "cluster.qos",
        "pass cluster.qos=<a QoS your account may use (`sacctmgr show assoc user=$USER format=account,qos`)>.",
    ),
    (
        "feature specification",
        "cluster.constraint",
        "pass cluster.constraint=<a feature `sinfo -o '%N %f'` lists>, or cluster.constraint=null.",
    ),
    ("time limit", "resources.time", "ask for a shorter resources.time (see the partition's MaxTime in `sinfo`)."),
    (
        "gres",
        "resources.gpus_per_node",
        "lower resources.gpus_per_node, or set cluster.gpu_flag=gpus-per-node if your site wants --gpus-per-node.",
    ),
    (
        "unrecognized option",
        "cluster.extra",
        "remove or correct that option in cluster.extra (`sbatch --help` lists the valid ones).",
    ),
    ("invalid --", "cluster.extra", "correct that option's value in cluster.extra."),
    (
        "node configuration is not available",
        "resources",
        (
            "ask for what one node of the partition has (`sinfo -N -o '%N %c %G %m'`): resources.gpus_per_node,"
            " cluster.cpus_per_gpu, cluster.mem_gb, cluster.constraint."
        ),
    ),
)


def refusal_error(slurm_says: str, cancelled: Sequence[str] = ()) -> ConfigError:
    """One ConfigError for a failed sbatch: Slurm's own words, the key they point at, and the fix."""
    words = (
        " ".join(
            line.strip() for line in slurm_says.strip().splitlines() if line.strip() and not line.startswith("Try ")
        )
        or "sbatch failed without a message"
    )
    key, fix = (
        "cluster",
        (
            "print the sbatch script with dry_run=true and compare it with your site's limits (`sinfo`, `sacctmgr show"
            " assoc user=$USER`)."
        ),
    )
    lowered = words.lower()
    for needle, known_key, known_fix in _REFUSALS:
        if needle in lowered:
            key, fix = known_key, known_fix
            break
    note = (
        f" The jobs this command had already queued ({', '.join(cancelled)}) were cancelled: nothing of it is left."
        if cancelled
        else ""
    )
    return ConfigError(key, f"Slurm refused the job: {words}.{note}", fix)


class SubmissionInterrupted(Interrupted):
    """Ctrl-C (SIGINT) while submit_jobs was queueing: what it had queued is cancelled, and the message says so.

    Still a KeyboardInterrupt, so code that lets Ctrl-C through (Hydra, a notebook, the Python
    API) still does; the ``hpc-train`` command and the Hydra-app launcher print its one line and
    exit with ``exit_code``.
    """

    def __init__(self, cancelled: int, total: int) -> None:
        self.cancelled, self.total = cancelled, total  # jobs cancelled; jobs the command was queueing
        super().__init__(cancelled, total)

    def __str__(self) -> str:
        what = "sweep" if self.total > 1 else "job"
        if self.total == 1:
            done = "Slurm had queued it, and it was cancelled" if self.cancelled else "it had not been queued yet"
        elif not self.cancelled:
            done = "no job had been queued yet"
        elif self.cancelled == 1:
            done = "the 1 job already queued was cancelled"
        else:
            done = f"the {self.cancelled:,} jobs already queued were cancelled"
        return (
            f"hpc-train: interrupted while queueing the {what}: {done}; nothing of the {what} is left in Slurm."
            " Run the same command to submit it again."
        )


STRAY_LOOK_AGAIN_S = 1.0  # a cut-off sbatch's request may reach the controller just after our first look


class _Submission:
    """What one submit_jobs call queued and wrote, to take back whole when sbatch refuses part-way or Ctrl-C comes.

    submitit writes the pickled jobs and the script into the log folder before it calls sbatch
    and prints sbatch's stderr itself; both would outlive a refusal and mislead a later look or
    resume. A sweep cut into several arrays may be refused at its third: the arrays already
    queued are cancelled (scancel) so the sweep goes in whole or not at all. Ctrl-C reaches the
    sbatch under way too (the terminal signals its whole process group): Slurm may have made
    that job though submitit never read its id, so it is looked up by its script (see
    ``_stray_jobs``) and cancelled with the rest.
    """

    def __init__(self) -> None:
        self.queued: List[str] = []  # Slurm job ids (array ids) in submission order
        self.jobs = 0  # how many jobs (array tasks) those ids hold
        self.in_flight = 0  # jobs of the sbatch call under way, whose id is not in `queued` yet (0: none)
        self._before: Dict[Path, Optional[set]] = {}  # folder -> its entries before this call (None: absent)

    def watch(self, folder: Path) -> None:
        """Note what submitit's folder holds before this call (a folder named with %j: its first fixed parent)."""
        from submitit.core.utils import JobPaths  # submitit (~50 ms): only to submit

        folder = JobPaths.get_first_id_independent_folder(folder)
        if folder not in self._before:
            self._before[folder] = set(folder.iterdir()) if folder.exists() else None

    def sending(self, jobs: int) -> None:
        self.in_flight = jobs

    def sent(self, job_id: str, jobs: int) -> None:
        self.queued.append(job_id)
        self.jobs += jobs
        self.in_flight = 0

    def take_back(self) -> int:
        """Cancel what this call queued and remove the files it wrote; returns how many jobs were cancelled.

        A second Ctrl-C meanwhile is ignored (by scancel and squeue too): half a clean-up would
        leave part of the sweep queued.
        """
        with _ctrl_c_ignored():
            new = self._new_entries()
            strays = _stray_jobs(new, self.queued) if self.in_flight else []
            if self.queued or strays:
                slurm_cli.run(["scancel", *self.queued, *strays])
            for path in new:
                shutil.rmtree(path) if path.is_dir() and not path.is_symlink() else path.unlink(missing_ok=True)
            for folder, before in self._before.items():
                if before is None and folder.exists() and not any(folder.iterdir()):
                    folder.rmdir()
        return self.jobs + (self.in_flight if strays else 0)

    def _new_entries(self) -> List[Path]:
        return [
            path
            for folder, before in self._before.items()
            for path in (set(folder.iterdir()) if folder.exists() else set()) - (before or set())
        ]


class Queueing:
    """Ctrl-C from the first sbatch until the jobs are written down (job specs, jobs.tsv) cancels them all.

    submit_jobs takes back what it queued when Ctrl-C comes while it queues; the writing after it
    is part of queueing too, or Ctrl-C there would leave jobs queued that no job table lists. So
    a Ctrl-C meanwhile waits for the writing to end, then cancels every job of `submitted`.
    """

    def __init__(self, total: int) -> None:
        self.total = total
        self.submitted: List[Tuple[Any, Any]] = []  # submit_jobs' (job, handle) pairs, once it returned

    def __enter__(self) -> "Queueing":
        self._ctrl_c = _CtrlC()
        return self

    def __exit__(self, kind: Any, error: Any, trace: Any) -> bool:
        self._ctrl_c.restore()
        if kind is None and self._ctrl_c.count and self.submitted:
            with _ctrl_c_ignored():
                slurm_cli.run(["scancel", *sorted({str(handle.job_id).split("_")[0] for _, handle in self.submitted})])
            raise SubmissionInterrupted(len(self.submitted), self.total)
        return False


class _CtrlC:
    """Ctrl-C while queueing takes effect between sbatch calls, never inside submitit's code (a KeyboardInterrupt
    there leaves half-built job objects whose finalizers print tracebacks at exit). The sbatch under way gets the
    terminal's SIGINT itself; a second Ctrl-C interrupts at once. Outside the main thread Python's own handling
    stays."""

    def __init__(self) -> None:
        self.count = 0
        self._installed = threading.current_thread() is threading.main_thread()
        self._previous: Any = signal.signal(signal.SIGINT, self._pressed) if self._installed else None

    def _pressed(self, signum: int, frame: Any) -> None:
        self.count += 1
        if self.count > 1:
            raise KeyboardInterrupt

    def take_effect(self) -> None:
        if self.count:
            raise KeyboardInterrupt

    def restore(self) -> None:
        if self._installed:
            signal.signal(signal.SIGINT, self._previous if self._previous is not None else signal.SIG_DFL)
            self._installed = False


@contextlib.contextmanager
def _ctrl_c_ignored() -> Iterator[None]:
    """SIGINT ignored inside (in the main thread; elsewhere Python delivers it to the main thread anyway)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def _stray_jobs(new_files: Sequence[Path], known: Sequence[str]) -> List[str]:
    """Ids of the user's queued jobs whose batch script is one this call wrote, other than `known`.

    An sbatch cut off by Ctrl-C may have made its job without printing the id. The script path
    (submitit's ``.submission_file_<uuid>.sh``, new in the submission folder since this call
    began) names that one call, where the job name or the log folder would also match the user's
    other jobs (an earlier sweep of the same name, a resume into the same folder). Slurm keeps it
    as squeue's command (``%o``), made absolute. Looked at twice, a moment apart, when the first
    look finds nothing.
    """
    scripts = {os.path.realpath(path) for path in new_files if path.name.endswith(".sh")}
    for attempt in range(2):
        if attempt:
            time.sleep(STRAY_LOOK_AGAIN_S)
        listing = slurm_cli.query(["squeue", "--me", "-h", "-o", "%F %o"]) or ""
        found = {
            job
            for job, _, command in (line.strip().partition(" ") for line in listing.splitlines())
            if job and job not in known and os.path.realpath(command) in scripts
        }
        if found:
            return sorted(found)
    return []


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
    removing submitit's files (``_Submission.take_back``).
    ``task`` makes what each Slurm task runs from a job spec (default: ``TrainingJob``).
    """
    from submitit.core.utils import FailedJobError  # submitit (~50 ms): only to submit, not for a dry run

    from hpc_train.compute.entry.job import TrainingJob  # compute side (imports submitit): only to submit

    make_task = task or TrainingJob
    groups: Dict[str, List[PreparedJob]] = {}
    for job in jobs:
        groups.setdefault(_group_key(job.params), []).append(job)
    chunk = array_chunk() if any(len(members) > 1 for members in groups.values()) else 1
    arrays = [part for members in groups.values() for part in _chunks(members, chunk)]
    submission = _Submission()
    submitted: List[Tuple[PreparedJob, Any]] = []
    previous_throttled: Optional[str] = None
    pressed = _CtrlC()
    try:
        for number, members in enumerate(arrays, 1):
            pressed.take_effect()
            first = members[0]
            folder = first.folder or (
                (log_root if (log_root is not None and len(members) > 1) else first.log_dir) / rundir.SLURM_LOGS
            )
            submission.watch(folder)
            params = dict(first.params)
            throttled = "array_parallelism" in params
            params.setdefault("array_parallelism", len(members))  # submitit would throttle to 256 otherwise
            if throttled and len(members) > 1 and previous_throttled:
                # One throttled array after the other: the whole sweep runs at most P jobs at once.
                extra = dict(params.get("additional_parameters") or {})
                extra["dependency"] = ",".join(
                    filter(None, [str(extra.get("dependency") or ""), f"afterany:{previous_throttled}"])
                )
                params["additional_parameters"] = extra
            executor = make_executor(folder, params, first.max_requeues)
            submission.sending(len(members))
            with contextlib.redirect_stderr(io.StringIO()):
                if len(members) == 1:
                    handles = [executor.submit(_payload(first, make_task))]
                else:
                    with executor.batch():
                        handles = [executor.submit(_payload(job, make_task)) for job in members]
            for job in members:
                job.submitted_to = folder
            submission.sent(str(handles[0].job_id).split("_")[0], len(members))
            if throttled and len(members) > 1:
                previous_throttled = submission.queued[-1]
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
