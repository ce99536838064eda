"""A planned job's sbatch parameters: the layout's shape and the cluster profile's partition, account, QoS,
constraint, CPUs per GPU, hint, setup lines and extra options, checked before anything is queued."""

from __future__ import annotations

import os
import re
import shlex
from typing import Any, Dict, Optional

from hpc_train.config.checks import count_range
from hpc_train.config.errors import ConfigError
from hpc_train.config.launcher import signal_name
from hpc_train.config.view import ConfigView, plain
from hpc_train.contracts.replica_plan import ReplicaPlan
from hpc_train.launch.backends.slurm.step import STEP_KEY, step_parameters
from hpc_train.launch.planning import capacity
from hpc_train.launch.planning.layout import JobLayout
from hpc_train.launch.planning.plan import RunPlan
from hpc_train.processes.rank_env import unset_line
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
        STEP_KEY: step_parameters(cfg, layout, plan.run_dir),
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
    # To the batch host's agent only (B:): it passes the signal on to the step, whatever runs the ranks.
    extra["signal"] = f"B:{signal_name}@{int(cfg.launcher.signal_delay_s)}"
    replicas = params[STEP_KEY].get("replicas")
    if replicas:  # a failed node takes down its group's step only; spare nodes to restart it on at once
        extra["no-kill"] = True
        params["nodes"] = layout.nodes + ReplicaPlan.from_record(replicas).spare_nodes
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


def submitit_parameters(params: Dict[str, Any]) -> Dict[str, Any]:
    """`params` as submitit takes them: a range of nodes (``2-4``) goes in as the ``--nodes`` sbatch option.

    submitit multiplies ``nodes`` by the tasks per node to number the job's tasks (its results), so it is given the
    range's least, whose tasks every allocation has, and its additional parameters write ``--nodes=2-4`` in place of
    that line: the script is the one ``render_sbatch`` shows.
    """
    params = {key: value for key, value in params.items() if key != STEP_KEY}
    params["use_srun"] = False  # the batch host's agent runs srun (slurm_step.step_python)
    nodes = params.get("nodes")
    if not isinstance(nodes, str):
        return params
    least, _ = count_range(nodes)
    extra = {**(params.get("additional_parameters") or {}), "nodes": nodes}
    return {**params, "nodes": least, "additional_parameters": extra}


# The submitit parameters slurm_parameters() produces that become `#SBATCH --<key>=<value>` lines.
