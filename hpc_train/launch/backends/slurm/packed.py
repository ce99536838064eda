"""Packed sweeps on the login node: a sweep's runs shared out among a few allocations, each run a job step.

``launcher.pack.allocations=N`` (or ``hydra.launcher.pack.*`` for a Hydra app): instead of one job (or array
task) per run, N Slurm jobs of ``launcher.pack.nodes`` nodes x ``launcher.pack.gpus_per_node`` GPUs, their CPUs
``cluster.cpus_per_gpu`` per GPU, their time ``launcher.pack.time``. Each allocation's batch script is
hpc_train's pool (hpc_train.pack.scheduler), which starts its runs as job steps. The runs are shared out here,
once (the dry run prints who takes what): in the sweep's order, each to the allocation with the fewest GPUs
assigned so far. A run larger than an allocation, or runs that disagree on what an allocation is (partition,
account, setup lines...), are refused before anything is queued. An adaptive study's allocations are fed instead
(plan_fed): submitted with empty plans, each rung handed to them as it starts (hpc_train.pack.feed).
"""

from __future__ import annotations

import dataclasses
import shlex
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from hpc_train.config.errors import ConfigError
from hpc_train.config.view import wrap
from hpc_train.jobs import job_table
from hpc_train.launch.backends.run import report_summary
from hpc_train.launch.backends.slurm import queueing as slurm_queueing
from hpc_train.launch.backends.slurm.params import time_minutes
from hpc_train.launch.backends.slurm.refusals import refusal_error
from hpc_train.launch.backends.slurm.script import sbatch_flag
from hpc_train.launch.backends.slurm.step import STEP_KEY, container_of, job_files_of
from hpc_train.launch.backends.slurm.submit import PreparedJob
from hpc_train.launch.planning import capacity
from hpc_train.launch.planning.errors import StoppedWaiting
from hpc_train.pack import records, status
from hpc_train.pack.records import AllocationPlan, PackedRun
from hpc_train.records import rundir
from hpc_train.slurm import slurm_cli

# The sbatch parameters every run of one allocation must agree on (its layout and time are the allocation's).
SHARED = ("partition", "account", "qos", "constraint", "mem", "setup", "additional_parameters")
WORKER = ("-u", "-m", "hpc_train.compute.worker")  # what a run's step runs: one rank, as under plain sbatch


@dataclass(frozen=True)
class PackKeys:
    """The keys a packed sweep's refusals name: hpc-train's own (the default), or a Hydra app's hydra.launcher.*."""

    pack: str = "launcher.pack"  # the allocations' keys: <pack>.allocations, .nodes, .gpus_per_node, .time
    run_gpus: str = "resources.gpus_per_node"  # what sets a run's GPUs
    cpus_per_gpu: str = "cluster.cpus_per_gpu"  # what sets an allocation's CPUs per GPU
    # the keys of the allocation's capacity check: its nodes and GPUs are launcher.pack.*'s, not a run's
    capacity: capacity.Keys = capacity.Keys(nodes="launcher.pack.nodes", gpus="launcher.pack.gpus_per_node")
    time: str = "cluster.time"  # what sets an allocation's time when <pack>.time does not
    profile: str = ""  # where the cluster profile is named, for messages (" (hydra.launcher.cluster)")


@dataclass(frozen=True)
class PackShape:
    """What each allocation is: launcher.pack.* completed from the cluster profile."""

    allocations: int
    nodes: int
    gpus_per_node: int
    cpus_per_node: int
    minutes: int
    time_key: str  # the key the time came from, for messages


def pack_shape(cfg: Mapping[str, Any], keys: PackKeys = PackKeys()) -> Optional[PackShape]:
    """<pack>.* completed from the cluster's settings; None when the sweep is not packed (<pack>.allocations null,
    or a launcher without the keys). `cfg`: launcher.pack, the allocations' keys, and cluster, what completes them
    (its gpus_per_node, cpus_per_gpu, else 1, and time): hpc-train's config, or a Hydra app's hydra.launcher node
    arranged so, as plain data (hpc_train.launch.hydra.app_launcher); `keys`: the keys its refusals name."""
    cfg = wrap(cfg)
    pack = cfg.launcher.get("pack")
    if pack is None or pack.get("allocations") is None:
        return None
    for key in ("allocations", "nodes", "gpus_per_node"):
        if pack.get(key) is not None and int(pack[key]) < 1:
            raise ConfigError(
                f"{keys.pack}.{key}", f"{pack[key]} is not a positive count.", f"set {keys.pack}.{key}=1 or more."
            )
    cluster = cfg.cluster
    gpus = pack.get("gpus_per_node") or cluster.get("gpus_per_node")
    if not gpus:
        raise ConfigError(
            f"{keys.pack}.gpus_per_node",
            f"no GPU count for the packed allocations: neither {keys.pack}.gpus_per_node nor the cluster profile's"
            f" gpus_per_node{keys.profile} is set.",
            f"set {keys.pack}.gpus_per_node=4 (the GPUs of each allocation's nodes), or gpus_per_node in your cluster"
            " profile.",
        )
    own_time = pack.get("time") is not None
    time_key = f"{keys.pack}.time" if own_time else keys.time
    minutes = time_minutes(pack["time"] if own_time else cluster.get("time"), time_key)
    cpus = int(cluster.get("cpus_per_gpu") or 1) * int(gpus)
    return PackShape(int(pack.allocations), int(pack.get("nodes") or 1), int(gpus), cpus, minutes, time_key)


def share_out_runs(runs: Sequence[PackedRun], shape: PackShape) -> List[List[int]]:
    """Which runs (indices into `runs`) each allocation takes: in order, each to the least loaded, a run weighing the
    share of an allocation's node it takes, by GPUs or by CPUs, whichever is larger (a run without GPUs weighs its
    CPUs)."""
    weights = [
        run.nodes * max(run.gpus_per_node / shape.gpus_per_node, run.cpus_per_node / shape.cpus_per_node)
        for run in runs
    ]
    return _share_by_load(weights, shape.allocations)


def _share_by_load(needs: Sequence[float], allocations: int) -> List[List[int]]:
    count = min(allocations, len(needs))
    loads, taken = [0.0] * count, [[] for _ in range(count)]  # type: List[float], List[List[int]]
    for i, need in enumerate(needs):
        k = min(range(count), key=lambda a: (loads[a], a))
        taken[k].append(i)
        loads[k] += need
    return taken


def check_runs_fit(jobs: Sequence[PreparedJob], shape: PackShape) -> None:
    """Every run fits one allocation, and they all agree on what an allocation is; ConfigError naming the key."""
    check_packed_fit([packed_run(job) for job in jobs], [job.params for job in jobs], shape)


def check_packed_fit(
    runs: Sequence[PackedRun],
    params: Sequence[Dict[str, Any]],
    shape: PackShape,
    keys: PackKeys = PackKeys(),
    shared: Sequence[str] = SHARED,
) -> None:
    """check_runs_fit for runs already described as PackedRun, with their sbatch parameters and the keys to name."""
    first, first_params = runs[0], params[0]
    for run, run_params in zip(runs, params):
        where = f"sweep job #{run.job} ({run.label or 'no overrides'})"
        if run.nodes > shape.nodes:
            raise ConfigError(
                f"{keys.pack}.nodes",
                f"{where} runs on {run.nodes} nodes, more than each allocation's {shape.nodes}.",
                f"set {keys.pack}.nodes={run.nodes} or more, or give that run fewer nodes.",
            )
        if run.gpus_per_node > shape.gpus_per_node:
            raise ConfigError(
                f"{keys.pack}.gpus_per_node",
                f"{where} needs {run.gpus_per_node} GPUs per node, more than each allocation's {shape.gpus_per_node}.",
                f"set {keys.pack}.gpus_per_node={run.gpus_per_node} or more, or give that run fewer GPUs"
                f" ({keys.run_gpus}).",
            )
        if run.cpus_per_node > shape.cpus_per_node:
            raise ConfigError(
                f"{keys.pack}.gpus_per_node",
                f"{where} needs {run.cpus_per_node} CPUs per node, more than each allocation's {shape.cpus_per_node}"
                f" ({keys.cpus_per_gpu} x {keys.pack}.gpus_per_node).",
                f"give the allocations more GPUs (and so CPUs): raise {keys.pack}.gpus_per_node.",
            )
        for key in shared:
            if run_params.get(key) != first_params.get(key):
                raise ConfigError(
                    f"{keys.pack}.allocations",
                    f"{where} asks for {key.replace('_', ' ')} {run_params.get(key)!r}, but sweep job"
                    f" #{first.job} for {first_params.get(key)!r}: runs that share an allocation share"
                    " its partition, account, QOS, memory and setup lines.",
                    f"sweep the runs that differ in {key.replace('_', ' ')} as separate packed sweeps.",
                )


def packed_allocation_params(
    first: Dict[str, Any], shape: PackShape, index: int, shared: Sequence[str] = SHARED, gpus: bool = True
) -> Dict[str, Any]:
    """The allocation's sbatch parameters, from its first run's: the keys `shared`, its own shape and time (its GPUs
    only when `gpus`: some run of it needs one), the signal to its batch script only (B:), which sends it on to its
    running steps itself."""
    params = {key: first[key] for key in shared if first.get(key) is not None}
    gres: Dict[str, Any] = {}
    if gpus:
        gres = {"gres": f"gpu:{shape.gpus_per_node}"} if "gres" in first else {"gpus_per_node": shape.gpus_per_node}
    per_gpu = shape.cpus_per_node // shape.gpus_per_node
    extra = dict(params.pop("additional_parameters", {}) or {})
    signal = str(extra.get("signal", "USR2@120"))
    extra["signal"] = signal if signal.startswith("B:") else f"B:{signal}"
    params.update(
        job_name=f"{first['job_name']}-pack{index}",
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
    lines += [
        "",
        "# the pool: each run of this allocation a job step (srun --exact)",
        "exec " + shlex.join(command),
        "",
    ]
    return "\n".join(lines)


def packed_run(job: PreparedJob) -> PackedRun:
    layout, run_dir = job.plan.layout, job.plan.run_dir
    if layout.max_nodes is not None:
        raise ConfigError(
            "resources.nodes",
            f"sweep job #{run_dir.name} ({job.label or 'no overrides'}) asks for {layout.nodes_text} nodes, but a"
            " packed run runs on a fixed number of its allocation's nodes.",
            f"give packed runs resources.nodes=N (e.g. resources.nodes={layout.nodes}), or leave launcher.pack out to"
            " submit each run as its own job.",
        )
    job_files = job_files_of(run_dir.absolute().parent / "slurm")
    step = container_of(job.params.get(STEP_KEY) or {}, job_files, stage=not job.plan.config.dry_run)
    inner = step.argv([]) if step is not None else [sys.executable]
    return PackedRun(
        job=run_dir.name,
        run_dir=str(run_dir.absolute()),
        label=job.label,
        nodes=layout.nodes,
        tasks_per_node=layout.tasks_per_node,
        gpus_per_task=layout.gpus_per_task,
        cpus_per_task=layout.cpus_per_task,
        command=[*inner, *WORKER, str(run_dir.absolute() / "job_config.yaml")],
        environment=dict(step.set_env) if step is not None else {},
        srun_flags=list(step.srun_flags) if step is not None else [],
        unset=list(step.unset) if step is not None else [],
    )


def plan_allocations(
    jobs: Sequence[PreparedJob], shape: PackShape, sweep_dir: Path, signal: str, signal_delay_s: int
) -> List[Tuple[AllocationPlan, Dict[str, Any]]]:
    """Each allocation's plan (not yet written) and sbatch parameters."""
    runs = [packed_run(job) for job in jobs]
    params = [job.params for job in jobs]
    requeues = [job.max_requeues for job in jobs]
    return plan_packed(runs, params, requeues, shape, sweep_dir, signal, signal_delay_s)


def plan_packed(
    runs: Sequence[PackedRun],
    params: Sequence[Dict[str, Any]],
    max_requeues: Sequence[int],
    shape: PackShape,
    sweep_dir: Path,
    signal: str,
    signal_delay_s: int,
    keys: PackKeys = PackKeys(),
    shared: Sequence[str] = SHARED,
    shares: Optional[List[List[int]]] = None,
) -> List[Tuple[AllocationPlan, Dict[str, Any]]]:
    """plan_allocations for runs already described as PackedRun (a Hydra app's: its own step command), each with
    its sbatch parameters and requeue budget; refusals name `keys`; `shares`: who goes where (default:
    share_out_runs). An allocation none of whose runs needs a GPU asks for none (its plan has 0 GPUs a node)."""
    check_packed_fit(runs, params, shape, keys, shared)
    any_gpus = any(run.gpus_per_node for run in runs)
    capacity.check_capacity(
        packed_allocation_params(params[0], shape, 0, shared, any_gpus), shape.time_key, keys=keys.capacity
    )
    start = records.next_index(records.read_plans(sweep_dir))
    out = []
    for k, taken in enumerate(share_out_runs(runs, shape) if shares is None else shares):
        index = start + k
        mine = [runs[i] for i in taken]
        gpus = any(run.gpus_per_node for run in mine)
        plan = records.new_plan(
            index,
            shape if gpus else dataclasses.replace(shape, gpus_per_node=0),
            signal,
            signal_delay_s,
            max(max_requeues[i] for i in taken),
            mine,
            packed_allocation_params(params[taken[0]], shape, index, shared, gpus),
        )
        out.append((plan, plan.sbatch))
    return out


def plan_fed(
    run: PackedRun,
    params: Dict[str, Any],
    max_requeues: int,
    shape: PackShape,
    sweep_dir: Path,
    signal: str,
    signal_delay_s: int,
    keys: PackKeys = PackKeys(),
    shared: Sequence[str] = SHARED,
) -> List[Tuple[AllocationPlan, Dict[str, Any]]]:
    """Fed allocations (an adaptive study's, hpc_train.pack.feed): their plans empty, each run handed to them later
    through the feed. Shaped and checked against `run`, a run as the study's runs are (its config's fixed part): one
    that does not fit an allocation is refused here, before anything is queued; refusals name `keys` (a Hydra app's
    study: its hydra.launcher.* keys, and the sbatch keys its runs share)."""
    check_packed_fit([run], [params], shape, keys, shared)
    gpus = bool(run.gpus_per_node)
    sbatch = packed_allocation_params(params, shape, 0, shared, gpus)
    capacity.check_capacity(sbatch, shape.time_key, keys=keys.capacity)
    start = records.next_index(records.read_plans(sweep_dir))
    own = shape if gpus else dataclasses.replace(shape, gpus_per_node=0)
    out = []
    for index in range(start, start + shape.allocations):
        sbatch = packed_allocation_params(params, shape, index, shared, gpus)
        plan = records.new_plan(index, own, signal, signal_delay_s, max_requeues, [], sbatch, fed=True)
        out.append((plan, sbatch))
    return out


def describe(plan: AllocationPlan, params: Dict[str, Any], sweep_dir: Path) -> str:
    """The dry run's text for one allocation: its script and its runs."""
    script = render(records.plan_path(sweep_dir, plan.index), params, records.folder(sweep_dir))
    runs = ", ".join(f"#{run.job}" for run in plan.runs)
    return (
        f"# allocation {plan.index}: {plan.nodes} node(s) x {_gpus_text(plan)}, {plan.minutes} min;"
        f" {len(plan.runs)} run{'s' if len(plan.runs) != 1 else ''} ({runs})\n{script}"
    )


def _gpus_text(plan: AllocationPlan) -> str:
    return f"{plan.gpus_per_node} GPUs" if plan.gpus_per_node else f"{plan.cpus_per_node} CPUs, no GPU"


def submit(plans: List[Tuple[AllocationPlan, Dict[str, Any]]], sweep_dir: Path) -> List[AllocationPlan]:
    """Write each plan (with the sbatch parameters its script is rendered from: what --rerun-failed reads) and its
    script, sbatch it, record its job id; all or nothing (a refusal cancels the rest)."""
    folder = records.folder(sweep_dir)
    folder.mkdir(parents=True, exist_ok=True)
    submitted: List[AllocationPlan] = []
    for plan, params in plans:
        plan.sbatch = params
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
    job, state, said, since = run_dir.name, None, False, rundir.launched_at(run_dir)
    try:
        while True:
            state = status.packed_states(sweep_dir).get(job)
            # interrupted now, or it was while an earlier run was followed (its attempt log counts a second start)
            again = state is not None and (
                state.state == records.INTERRUPTED or rundir.attempts_started(run_dir, since) > 1
            )
            if again and not said:
                said = True
                print(
                    f"hpc-train: packed run {records.packed_id(str(state.job_id), job)} was interrupted (its allocation"
                    " was requeued); following it to the end of its last attempt",
                    flush=True,
                )
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


def queue(
    plans: List[Tuple[AllocationPlan, Dict[str, Any]]], sweep_dir: Path, rows: Sequence[Tuple[str, str, str]]
) -> Tuple[List[AllocationPlan], Dict[str, str]]:
    """Submit the allocations and list their runs in jobs.tsv, `rows` being each run's (number, overrides, layout);
    Ctrl-C meanwhile cancels them all (hpc_train.launch.backends.slurm.queueing.Queueing). The plans submitted, and
    each run's packed id by its number."""
    with slurm_queueing.Queueing(len(plans)) as queueing:
        submitted = submit(plans, sweep_dir)
        queueing.submitted = [(plan, plan) for plan in submitted]
        ids = {run.job: records.packed_id(str(plan.job_id), run.job) for plan in submitted for run in plan.runs}
        job_table.print_and_append(
            sweep_dir, [job_table.JobRow(ids[job], job, label, layout) for job, label, layout in rows]
        )
    return submitted, ids
