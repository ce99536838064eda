"""The memory check before queueing: each rank's estimated peak (``python -m hpc_train.compute.fit``, fit_run) plus
what its device holds beyond tensors (contracts.gpu_memory) against one GPU's memory; a job that will not fit is
refused in one message, with the settings that do, each as the overrides to paste.

``resources.memory_check``: auto runs it where the GPU's memory is known (``cluster.gpu_type`` or
``cluster.gpu_memory_gb``) and the job trains hpc_train's model (a script's model is the script's own); always
(refused where it cannot run); never. Neither auto without a known memory nor never starts a process.

A sweep's jobs that differ only in what does not change memory (learning rate, seed, run dir, logger ...) share one
estimate: :func:`memory_key` is what does, and the process keeps the estimates it made by that key.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from hpc_train.config.view import ConfigView
from hpc_train.contracts.gpu_memory import MEMORY_KEY, GpuMemory, device_bytes, gpu_memory, tensor_budget
from hpc_train.contracts.job_layout import JobLayout
from hpc_train.errors import ConfigError
from hpc_train.launch.planning import fit_run, fit_specs
from hpc_train.launch.planning.candidates import layout_candidates
from hpc_train.launch.planning.plan import RunPlan
from hpc_train.processes.script_command import is_script_job
from hpc_train.records import rundir
from hpc_train.sizes import size_text

KEY = fit_run.CHECK_KEY
# The trainer's keys that change no tensor a rank holds: left out of memory_key, so a sweep over them estimates once.
NOT_MEMORY = frozenset(
    "epochs max_steps lr min_lr weight_decay lr_schedule lr_schedule_steps lr_warmup_steps lr_step_every lr_step_gamma"
    " eval_every eval_batches log_every throughput_warmup_steps progress dist_timeout_s checkpoint_every"
    " keep_checkpoints async_checkpoint max_requeues hang_timeout_s requeue_on_hang stop_grace_s profile".split()
)
# The settings tried are estimated this many at once: the machine's cores, at most MOST_WORKERS (a login node is
# shared with its other users).
MOST_WORKERS = 8
_CORES = os.cpu_count()
WORKERS = max(1, min(MOST_WORKERS, _CORES if _CORES is not None else 1))
# A refusal's settings: estimated cheapest first, until this many fit (the rest not estimated: strategy=auto ranks
# them all).
SUGGESTED = 3
# (memory_key, with the step's costs) -> the estimate (or refusal) this process made for it; not a floor (which holds
# for its budget only) or a skipped one
_known: Dict[Tuple[str, bool], fit_run.Estimate] = {}


@dataclass(frozen=True)
class Fit:
    """A job's estimate against its GPU: the largest rank's need (its tensors' peak and its device's share)."""

    estimate: Mapping[str, Any]
    memory: GpuMemory
    rank: int
    tensors: int
    device: int

    @property
    def need(self) -> int:
        return self.tensors + self.device

    @property
    def fits(self) -> bool:
        return self.need <= self.memory.usable_bytes

    @property
    def floor(self) -> bool:
        """The need is the job's floor (hpc_train.compute.fit.floor): the least it holds, its step not simulated."""
        return bool(self.estimate.get("floor"))

    def share_text(self) -> str:
        """``41.2 GiB of 79.1 GiB (52 %)`` (``at least ...`` for a floor)."""
        usable = self.memory.usable_bytes
        least = "at least " if self.floor else ""
        return f"{least}{size_text(self.need)} of {size_text(usable)} ({100 * self.need / usable:.0f} %)"

    def describe(self) -> str:
        """The need in words, with its parts: what the estimate reads and what the device adds."""
        tensors = next(r for r in self.estimate["ranks"] if r["rank"] == self.rank)
        parts = ("parameters", "gradients", "optimizer_state", "activations", "temporaries", "transient", "inputs")
        words = " + ".join(f"{p.replace('_', ' ')} {size_text(tensors[p])}" for p in parts if tensors[p])
        device = (
            f"device {size_text(self.device)} (CUDA context, allocator slack, NCCL buffers: the"
            f" {self.memory.family.name} family's constants)"
        )
        if self.floor:
            return (
                f"its largest rank needs {self.share_text()}: {words} (the model's share at the optimizer's step,"
                f" its step not simulated: activations and temporaries come on top) + {device}"
            )
        return f"rank {self.rank} needs {self.share_text()}: {words} + {device}"

    def record(self) -> Dict[str, Any]:
        """What the run dir keeps (rundir.MEMORY_ESTIMATE): the estimate, the need and the memory it was held to."""
        return {
            "need_bytes": self.need,
            "rank": self.rank,
            "tensor_bytes": self.tensors,
            "device_bytes": self.device,
            "gpu_memory_bytes": self.memory.usable_bytes,
            "gpu_memory_source": self.memory.source,
            "estimate": dict(self.estimate),
        }


def keep(run_dir: Path, fit: Optional[Fit]) -> None:
    """The run dir keeps a checked job's estimate (rundir.MEMORY_ESTIMATE), which summary.json holds beside the
    measured peak (rundir.write_summary); nothing where the check did not run."""
    if fit is not None:
        rundir.write_json_atomic(run_dir / rundir.MEMORY_ESTIMATE, fit.record())


class MemoryRefused(ConfigError):
    """A job whose estimate exceeds its GPU's memory: the breakdown and the settings that fit."""


def check(plan: RunPlan, spec: Dict[str, Any], overrides: Optional[Sequence[str]] = None) -> Optional[Fit]:
    """The job's Fit when the check runs, None when it does not; raises MemoryRefused when it will not fit and
    ConfigError where the check was asked for (always) and cannot run. `overrides`: the job's own (a sweep's job);
    default: the running Hydra app's."""
    memory = wanted(plan.config, spec)
    if memory is None:
        return None
    with fit_run.session():  # the job's estimate, then its refusal's settings: one process
        # auto: an estimate that fails (the user's code importing what only the ranks' environment has) skips it
        [estimate] = estimates([spec], failed_refuses=plan.config.resources.memory_check != "always", memory=memory)
        if isinstance(estimate, fit_run.Refused):
            if plan.config.resources.memory_check == "always":
                raise ConfigError(KEY, f"the memory estimate cannot simulate this job: {estimate.reason}", _OFF)
            print(f"hpc-train: memory check skipped: {estimate.reason}", flush=True)
            return None
        fit = fit_of(estimate, memory, spec)
        if not fit.fits:
            print(
                f"hpc-train: memory check: the job will not fit ({fit.share_text()}); trying other settings", flush=True
            )
            raise MemoryRefused("strategy", _refusal(fit, _suggestions(plan, memory, overrides)), _FIX)
    return fit


_OFF = f"set {KEY}=never to queue the job without the check (or auto: skipped where it cannot run)."
_FIX = f"paste one of the settings above, or set {KEY}=never to queue the job as it is."


def wanted(view: ConfigView, spec: Mapping[str, Any]) -> Optional[GpuMemory]:
    """The GPU's memory when the check is to run; None where it is off (never, or auto without a known memory, or a
    script job's). ConfigError for always where it cannot run, and for a GPU type whose memory is not known."""
    mode = view.resources.memory_check
    if mode == "never":
        return None
    if is_script_job(spec):
        if mode == "always":
            raise ConfigError(KEY, "a script job's model is the script's own: the estimate cannot know it.", _OFF)
        return None
    memory = gpu_memory(view.cluster.get("gpu_type"), view.cluster.get("gpu_memory_gb"))  # UnknownMemory
    if memory is None and mode == "always":
        raise ConfigError(
            MEMORY_KEY,
            f"{KEY}=always needs the GPU's memory; the cluster profile gives none (cluster.gpu_type, {MEMORY_KEY}).",
            f"set {MEMORY_KEY}=N (one GPU's memory in GB, e.g. 80), or {KEY}=auto to check where it is known.",
        )
    return memory


def warm(jobs: Sequence[Tuple[RunPlan, Dict[str, Any]]]) -> None:
    """Estimate, in one process, the jobs of a sweep that the check will ask about (each distinct memory once), so
    that checking them one by one after starts no process; a job the check refuses is left to its check."""
    specs = []
    for plan, spec in jobs:
        try:
            if wanted(plan.config, spec) is not None:
                specs.append(spec)
        except ConfigError:
            continue
    if specs:
        distinct = len({memory_key(spec) for spec in specs})
        print(f"hpc-train: memory check: {len(specs)} job(s), {distinct} distinct to estimate", flush=True)
        estimates(specs, failed_refuses=True)  # a failed one is each job's to judge: skipped under auto


def known_fit(plan: RunPlan, spec: Dict[str, Any]) -> Optional[Fit]:
    """The Fit of a job this process has estimated (what its run dir records, rundir.MEMORY_ESTIMATE), else None."""
    estimate = _earlier(memory_key(spec), False)
    memory = wanted(plan.config, spec) if estimate is not None else None
    if memory is None or isinstance(estimate, fit_run.Refused):
        return None
    return fit_of(estimate, memory, spec)


def estimates(
    specs: Sequence[Dict[str, Any]],
    failed_refuses: bool = False,
    costs: bool = False,
    memory: Optional[GpuMemory] = None,
    enough: Optional[int] = None,
) -> List[fit_run.Estimate]:
    """Each spec's estimate (with its step's costs where `costs`), from this process's earlier ones by memory_key (one
    with costs serves one without), the others in one process. With `memory`, a spec whose floor will not fit in it is
    answered with the floor, unsimulated; with `enough`, the specs after that many fit are Skipped."""
    keys = [memory_key(spec) for spec in specs]
    missing = {key: spec for key, spec in zip(keys, specs) if _earlier(key, costs) is None}
    budgets = None if memory is None else [budget(memory, spec) for spec in missing.values()]
    ask = fit_run.Ask(WORKERS, costs, budgets, enough)
    fresh = dict(zip(missing, fit_run.estimate(list(missing.values()), ask, failed_refuses)))
    for key, answer in fresh.items():
        if isinstance(answer, fit_run.Refused) or (isinstance(answer, dict) and not answer.get("floor")):
            _known[(key, costs)] = answer
    return [fresh[key] if key in fresh else _earlier(key, costs) for key in keys]


def budget(memory: GpuMemory, spec: Mapping[str, Any]) -> int:
    """The most bytes of tensors a rank of `spec`'s job can hold in `memory`, beside what its device adds."""
    return tensor_budget(memory, _communicators(spec))


def _earlier(key: str, costs: bool) -> Any:
    """This process's estimate for `key` that has what is asked (costs, or not), else None."""
    return _known.get((key, True), _known.get((key, False)) if not costs else None)


def memory_key(spec: Mapping[str, Any]) -> str:
    """What decides a job's memory: its model, data, strategy, the trainer's settings that hold tensors, the layout
    and where the user's code is imported from (not its run dir, learning rate, logger or seed)."""
    trainer = {k: v for k, v in spec["trainer"].items() if k not in NOT_MEMORY}
    job = spec["job"]
    kept = [spec["model"], spec["data"], spec["strategy"], trainer, job["layout"], job["code_dirs"]]
    return hashlib.sha256(json.dumps(kept, sort_keys=True, default=str).encode()).hexdigest()


def fit_of(estimate: Mapping[str, Any], memory: GpuMemory, spec: Mapping[str, Any]) -> Fit:
    """The largest rank's need: its tensors' peak, plus the context, the allocator's slack and NCCL's buffers."""
    communicators = _communicators(spec)
    fits = [
        Fit(estimate, memory, r["rank"], r["peak"], device_bytes(memory, r["peak"], communicators))
        for r in estimate["ranks"]
    ]
    return max(fits, key=lambda fit: fit.need)


def _communicators(spec: Mapping[str, Any]) -> int:
    """The NCCL communicators a rank of `spec`'s job joins: one per mesh dimension of more than one rank."""
    layout = spec["job"]["layout"]
    mesh = layout.get("mesh") or [layout["world_size"]]
    return sum(1 for size in mesh if size > 1)


Suggestion = Tuple[Tuple[str, ...], Fit]


@dataclass(frozen=True)
class Suggestions:
    """The settings tried with their Fit (those the estimate refused left out), fitting or not, and how many were
    not estimated once SUGGESTED fit."""

    found: List[Suggestion]
    skipped: int


def _suggestions(plan: RunPlan, memory: GpuMemory, base: Optional[Sequence[str]]) -> Suggestions:
    """The settings tried, cheapest to estimate first (_estimated_steps), in one process, until SUGGESTED fit."""
    tried, specs = [], []
    for overrides in _tried(plan):
        try:
            specs += fit_specs.specs_for([overrides], plan.run_dir, base)
        except ConfigError:  # a setting this job's checks refuse (a batch that no longer splits): not suggested
            continue
        tried.append(overrides)
    order = sorted(range(len(specs)), key=lambda i: _estimated_steps(specs[i]))
    tried, specs = [tried[i] for i in order], [specs[i] for i in order]
    found, skipped = [], 0
    answers = estimates(specs, failed_refuses=True, memory=memory, enough=SUGGESTED)
    for overrides, spec, estimate in zip(tried, specs, answers):
        if isinstance(estimate, fit_run.Skipped):
            skipped += 1
        elif not isinstance(estimate, fit_run.Refused):
            found.append((overrides, fit_of(estimate, memory, spec)))
    return Suggestions(sorted(found, key=lambda suggestion: suggestion[1].need), skipped)


def _estimated_steps(spec: Mapping[str, Any]) -> int:
    """What a spec's estimate costs, in one rank's forward and backward of one micro-batch: a rank per pipeline
    stage, each running the pipeline's micro-batches (``strategy.chunks``), times the gradient accumulation."""
    stages = JobLayout.from_record(spec["job"]["layout"]).stages
    chunks = spec["strategy"].get("chunks")
    micro_batches = 1 if stages == 1 or chunks is None else int(chunks)
    return stages * micro_batches * int(spec["trainer"]["grad_accum_steps"])


def _tried(plan: RunPlan) -> List[Tuple[str, ...]]:
    """The job's other layouts (candidates.layout_candidates; of a pipeline's micro-batch counts, the first: each
    pipeline stage is a rank more to estimate), activation checkpointing on its own layout and on FSDP, and twice the
    gradient accumulation (half the micro-batch, the same global batch)."""
    view = plan.config
    own = plan.layout.strategy
    layouts: Dict[Tuple[str, ...], Tuple[str, ...]] = {}
    for candidate in layout_candidates(view):
        if candidate.overrides[1:] or candidate.overrides[0] != f"strategy={own}":
            dims = tuple(o for o in candidate.overrides if not o.startswith("strategy.chunks="))
            layouts.setdefault(dims, candidate.overrides)
    tried = list(layouts.values())
    if view.trainer.activation_checkpointing == "none":
        tried.append(("trainer.activation_checkpointing=blocks",))
        if own != "fsdp":
            tried.append(("strategy=fsdp", "trainer.activation_checkpointing=blocks"))
    tried.append((f"trainer.grad_accum_steps={2 * int(view.trainer.grad_accum_steps)}",))
    return tried


def _refusal(fit: Fit, suggestions: Suggestions) -> str:
    usable = size_text(fit.memory.usable_bytes)
    lines = [f"the job will not fit in one GPU's memory ({usable}: {fit.memory.source}). {fit.describe()}."]
    fitting = [(overrides, f) for overrides, f in suggestions.found if f.fits]
    if fitting:
        lines.append("Settings that fit (overrides to paste, the largest rank's need):")
        lines += [f"  {' '.join(overrides)}: {f.share_text()}" for overrides, f in fitting]
    else:
        closest = "; ".join(f"{' '.join(o)}: {f.share_text()}" for o, f in suggestions.found[:3]) or "none estimated"
        lines.append(f"None of the settings tried fits (the closest: {closest}): more GPUs or a smaller batch.")
    if suggestions.skipped:
        lines.append(
            f"({suggestions.skipped} more setting(s) not estimated once {SUGGESTED} fit: strategy=auto ranks every"
            " layout that fits.)"
        )
    return "\n".join(lines) + "\n"
