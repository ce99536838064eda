"""Packed sweeps on the login node: a sweep's runs shared out among a few allocations, each run a job step.

``launcher.pack.allocations=N`` (or ``hydra.launcher.pack.*`` for a Hydra app): instead of one job (or array
task) per run, N Slurm jobs of ``launcher.pack.nodes`` nodes x ``launcher.pack.gpus_per_node`` GPUs, their CPUs
``cluster.cpus_per_gpu`` per GPU, their time ``launcher.pack.time``. Each allocation's batch script is
hpc_train's pool (hpc_train.pack.scheduler), which starts its runs as job steps. The runs are shared out here,
once (the dry run prints who takes what): in the sweep's order, each to the allocation with the fewest GPUs
assigned so far. A run larger than an allocation, or runs that disagree on what an allocation is (partition,
account, setup lines...), are refused before anything is queued.
"""

from __future__ import annotations

import shlex
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from hpc_train import rundir, slurm_cli
from hpc_train.config.errors import ConfigError
from hpc_train.config.view import ConfigView
from hpc_train.launch import capacity
from hpc_train.launch.errors import StoppedWaiting
from hpc_train.launch.run import report_summary
from hpc_train.launch.slurm import PreparedJob, refusal_error, sbatch_flag, time_minutes
from hpc_train.pack import records, status
from hpc_train.pack.records import AllocationPlan, PackedRun

# The sbatch parameters every run of one allocation must agree on (its layout and time are the allocation's).
SHARED = ("partition", "account", "qos", "constraint", "mem", "setup", "additional_parameters")
WORKER = ("-u", "-m", "hpc_train.compute.worker")  # what a run's step runs: one rank, as under plain sbatch


@dataclass(frozen=True)
class PackShape:
    """What each allocation is: launcher.pack.* completed from the cluster profile."""

    allocations: int
    nodes: int
    gpus_per_node: int
    cpus_per_node: int
    minutes: int
    time_key: str  # the key the time came from, for messages


def pack_shape(cfg: ConfigView) -> Optional[PackShape]:
    """None when the sweep is not packed (launcher.pack.allocations null, or a launcher without the keys)."""
    pack = cfg.launcher.get("pack")
    if pack is None or pack.get("allocations") is None:
        return None
    cluster = cfg.cluster
    gpus = pack.get("gpus_per_node") or cluster.get("gpus_per_node")
    if not gpus:
        raise ConfigError(
            "launcher.pack.gpus_per_node",
            "no GPU count for the packed allocations: neither launcher.pack.gpus_per_node nor the cluster profile's"
            " gpus_per_node is set.",
            "set launcher.pack.gpus_per_node=4 (or gpus_per_node in your cluster profile).",
        )
    time_key = "launcher.pack.time" if pack.get("time") is not None else "cluster.time"
    minutes = time_minutes(pack.get("time") if pack.get("time") is not None else cluster.time, time_key)
    cpus = int(cluster.get("cpus_per_gpu") or 1) * int(gpus)
    return PackShape(int(pack.allocations), int(pack.nodes), int(gpus), cpus, minutes, time_key)


def share_out(jobs: Sequence[PreparedJob], shape: PackShape) -> List[List[int]]:
    """Which jobs (indices into `jobs`) each allocation takes: in order, each to the least loaded by GPUs."""
    count = min(shape.allocations, len(jobs))
    loads, taken = [0] * count, [[] for _ in range(count)]  # type: List[int], List[List[int]]
    for i, job in enumerate(jobs):
        k = min(range(count), key=lambda a: (loads[a], a))
        taken[k].append(i)
        layout = job.plan.layout
        loads[k] += layout.nodes * layout.gpus_per_node
    return taken


def check_runs_fit(jobs: Sequence[PreparedJob], shape: PackShape) -> None:
    """Every run fits one allocation, and they all agree on what an allocation is; ConfigError naming the key."""
    first = jobs[0]
    for job in jobs:
        layout, number = job.plan.layout, job.plan.run_dir.name
        where = f"sweep job #{number} ({job.label or 'no overrides'})"
        if layout.nodes > shape.nodes:
            raise ConfigError(
                "launcher.pack.nodes",
                f"{where} runs on {layout.nodes} nodes, more than each allocation's {shape.nodes}.",
                f"set launcher.pack.nodes={layout.nodes} or more, or give that run fewer nodes.",
            )
        if layout.gpus_per_node > shape.gpus_per_node:
            raise ConfigError(
                "launcher.pack.gpus_per_node",
                f"{where} needs {layout.gpus_per_node} GPUs per node, more than each allocation's {shape.gpus_per_node}.",
                f"set launcher.pack.gpus_per_node={layout.gpus_per_node} or more, or give that run fewer GPUs"
                " (resources.gpus_per_node).",
            )
        cpus = layout.tasks_per_node * layout.cpus_per_task
        if cpus > shape.cpus_per_node:
            raise ConfigError(
                "launcher.pack.gpus_per_node",
                f"{where} needs {cpus} CPUs per node, more than each allocation's {shape.cpus_per_node}"
                " (cluster.cpus_per_gpu x launcher.pack.gpus_per_node).",
                "give the allocations more GPUs (and so CPUs): raise launcher.pack.gpus_per_node.",
            )
        for key in SHARED:
            if job.params.get(key) != first.params.get(key):
                raise ConfigError(
                    "launcher.pack.allocations",
                    f"{where} asks for {key.replace('_', ' ')} {job.params.get(key)!r}, but sweep job"
                    f" #{first.plan.run_dir.name} for {first.params.get(key)!r}: runs that share an allocation share"
                    " its partition, account, QOS, memory and setup lines.",
                    f"sweep the runs that differ in {key.replace('_', ' ')} as separate packed sweeps.",
                )


def allocation_params(first: PreparedJob, shape: PackShape, index: int) -> Dict[str, Any]:
    """The allocation's sbatch parameters: the runs' shared ones, its own shape and time, the signal to its batch
    script only (B:), which sends it on to its running steps itself."""
    params = {key: first.params[key] for key in SHARED if first.params.get(key) is not None}
    gres = {"gres": f"gpu:{shape.gpus_per_node}"} if "gres" in first.params else {"gpus_per_node": shape.gpus_per_node}
    per_gpu = shape.cpus_per_node // shape.gpus_per_node
    extra = dict(params.pop("additional_parameters", {}) or {})
    extra["signal"] = f"B:{extra.get('signal', 'USR2@120')}"
    params.update(
        job_name=f"{first.params['job_name']}-pack{index}",
        nodes=shape.nodes,
        ntasks_per_node=shape.gpus_per_node,
        cpus_per_task=per_gpu,
        time=shape.minutes,
        **gres,
        additional_parameters=extra,
    )
    return params


def render(plan_path: Path, params: Dict[str, Any], log_dir: Path) -> str:
    """The allocation's batch script: its #SBATCH lines, the cluster's setup lines, then the pool (exec'd, so
    the B: signal reaches it)."""
    options = {k: v for k, v in params.items() if k not in ("setup", "additional_parameters")}
    options.update(params.get("additional_parameters") or {})
    options["output"] = str(log_dir / "%j.out")
    options["error"] = str(log_dir / "%j.err")
    options["open-mode"] = "append"
    lines = ["#!/bin/bash", "", "# Parameters", *(sbatch_flag(key, options[key]) for key in sorted(options))]
    if params.get("setup"):
        lines += ["", "# setup", *params["setup"]]
    command = [sys.executable, "-u", "-m", "hpc_train.pack.scheduler", str(plan_path)]
    lines += ["", "# the pool: each run of this allocation a job step (srun --exact)", "exec " + shlex.join(command), ""]
    return "\n".join(lines)


def packed_run(job: PreparedJob) -> PackedRun:
    layout, run_dir = job.plan.layout, job.plan.run_dir
    return PackedRun(
        job=run_dir.name,
        run_dir=str(run_dir.absolute()),
        label=job.label,
        nodes=layout.nodes,
        tasks_per_node=layout.tasks_per_node,
        gpus_per_task=layout.gpus_per_task,
        cpus_per_task=layout.cpus_per_task,
        command=[sys.executable, *WORKER, str(run_dir.absolute() / "job_config.yaml")],
    )


def plan_allocations(
    jobs: Sequence[PreparedJob], shape: PackShape, sweep_dir: Path, signal: str, signal_delay_s: int
) -> List[Tuple[AllocationPlan, Dict[str, Any]]]:
    """Each allocation's plan (not yet written) and sbatch parameters."""
    check_runs_fit(jobs, shape)
    capacity.check_capacity(allocation_params(jobs[0], shape, 0), shape.time_key)
    start = records.next_index(sweep_dir)
    out = []
    for k, taken in enumerate(share_out(jobs, shape)):
        index = start + k
        plan = AllocationPlan(
            index=index,
            nodes=shape.nodes,
            gpus_per_node=shape.gpus_per_node,
            cpus_per_node=shape.cpus_per_node,
            minutes=shape.minutes,
            signal=signal,
            signal_delay_s=signal_delay_s,
            max_requeues=max(jobs[i].max_requeues for i in taken),
            runs=[packed_run(jobs[i]) for i in taken],
        )
        out.append((plan, allocation_params(jobs[taken[0]], shape, index)))
    return out


def describe(plan: AllocationPlan, params: Dict[str, Any], sweep_dir: Path) -> str:
    """The dry run's text for one allocation: its script and its runs."""
    script = render(records.plan_path(sweep_dir, plan.index), params, records.folder(sweep_dir))
    runs = ", ".join(f"#{run.job}" for run in plan.runs)
    return (
        f"# allocation {plan.index}: {plan.nodes} node(s) x {plan.gpus_per_node} GPUs, {plan.minutes} min;"
        f" {len(plan.runs)} run{'s' if len(plan.runs) != 1 else ''} ({runs})\n{script}"
    )


def submit(plans: List[Tuple[AllocationPlan, Dict[str, Any]]], sweep_dir: Path) -> List[AllocationPlan]:
    """Write each plan and its script, sbatch it, record its job id; all or nothing (a refusal cancels the rest)."""
    folder = records.folder(sweep_dir)
    folder.mkdir(parents=True, exist_ok=True)
    submitted: List[AllocationPlan] = []
    for plan, params in plans:
        plan_path = records.write_plan(sweep_dir, plan)
        script = folder / f"allocation_{plan.index}.sh"
        script.write_text(render(plan_path, params, folder))
        done = slurm_cli.run(["sbatch", "--parsable", str(script)])
        if done.returncode != 0:
            cancelled = [str(p.job_id) for p in submitted]
            if cancelled:
                slurm_cli.run(["scancel", *cancelled])
            for p, _ in plans:
                records.plan_path(sweep_dir, p.index).unlink(missing_ok=True)
            raise refusal_error(slurm_cli.said(done), cancelled)
        plan.job_id = done.stdout.strip().split(";")[0]
        records.write_plan(sweep_dir, plan)
        submitted.append(plan)
    return submitted


FOLLOW_POLL_S = 2.0  # how often a waiting login process reads a packed run's records


def follow(sweep_dir: Path, run_dir: Path) -> int:
    """Wait for one packed run to end; its closing lines, and its exit code (0 when it completed)."""
    job, state = run_dir.name, None
    try:
        while True:
            state = status.packed_states(sweep_dir).get(job)
            if state is not None and state.state in records.ENDED_STATES:
                break
            time.sleep(FOLLOW_POLL_S)
    except KeyboardInterrupt:  # the run is its allocation's now, and goes on
        raise StoppedWaiting(records.packed_id(str(state.job_id if state else "?"), job), run_dir) from None
    if state.state == records.COMPLETED:
        code = rundir.EXIT_OK
    elif state.exit_code in (rundir.EXIT_REFUSED, rundir.EXIT_HUNG, rundir.EXIT_INTERRUPTED):
        code = int(state.exit_code)
    else:
        code = rundir.EXIT_FAILED
    report_summary(run_dir, code)
    return code
