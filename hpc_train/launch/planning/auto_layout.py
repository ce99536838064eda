"""``strategy=auto``: hpc-train chooses the job's layout, then plans and runs it as if the user had typed it.

1. The candidates: every valid layout of the job's nodes x GPUs per node, of the kinds ``strategy.search`` names
   (:func:`hpc_train.launch.planning.candidates.layout_candidates`; tensor parallel with ``strategy.mesh``'s
   ``tp_plan``, the user's own mesh option).
2. Each composed into its job spec (``fit_specs``) and estimated, all in one process (the memory check's
   ``estimates``): each rank's peak memory, one step's FLOPs and communication (``hpc_train.compute.fit``).
3. Those the estimate refused (in its words) and those that do not fit one GPU's memory (where the memory is known:
   ``cluster.gpu_type`` or ``cluster.gpu_memory_gb``; else, on CPU workers too, every estimated layout fits) are
   set aside; the others are ranked by the modelled step time (:mod:`hpc_train.launch.planning.cost_model`).
4. The first runs: its job spec is the job's. The dry run prints the ranked table; a run prints its choice and keeps
   the table and why in the run dir (``rundir.LAYOUT_CHOICE``).

A script job is refused (its script lays out its own ranks), and so is a job none of whose layouts the estimate can
simulate (a model it cannot trace: the estimate's words name the module).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

from omegaconf import DictConfig

from hpc_train.config.engine import checked_view
from hpc_train.config.errors import ConfigError
from hpc_train.config.launcher import launcher_kind
from hpc_train.config.strategy import AUTO, strategy_id
from hpc_train.config.view import ConfigView
from hpc_train.launch.planning import fit_run, fit_specs, memory_check
from hpc_train.launch.planning.candidates import Candidate, layout_candidates, shipped_strategy
from hpc_train.launch.planning.cost_model import Rates, StepTime, rates_for, step_time
from hpc_train.launch.planning.jobspec import build_job_spec
from hpc_train.launch.planning.parallelism import Parallelism
from hpc_train.launch.planning.plan import RunPlan, count_local_gpus, make_plan
from hpc_train.launch.planning.validate import normalize_precision
from hpc_train.processes.script_command import is_script_job
from hpc_train.sizes import size_text

SPEC_ONLY = ("job", "backend")  # what a job spec adds to the config it was made from
_MESH_ALONE = ("strategy.tp=1", "strategy.pp=1", "strategy.dp_replicate=1", "strategy.dp_shard=-1")


@dataclass(frozen=True)
class Ranked:
    """One candidate after the estimate: its modelled step, its largest rank's memory, or why it was set aside."""

    candidate: Candidate
    spec: Optional[Dict[str, Any]]
    step: Optional[StepTime] = None
    memory: str = ""  # the largest rank's need (of the GPU's memory where known)
    refused: str = ""

    def record(self) -> Dict[str, Any]:
        step, times = self.step, {}
        if step is not None:
            times = {"step_s": step.total, "compute_s": step.compute, "comm_s": step.comm, "bubble_s": step.bubble}
        return {
            "layout": self.candidate.words,
            "overrides": list(self.candidate.overrides),
            **times,
            "memory": self.memory,
            **({"refused": self.refused} if self.refused else {}),
        }


@dataclass(frozen=True)
class Choice:
    """The candidates, those that fit first (fastest first), then those set aside; the rates and memory used."""

    ranked: List[Ranked]
    rates: Rates
    memory: str

    @property
    def chosen(self) -> Ranked:
        return self.ranked[0]

    @property
    def fitting(self) -> List[Ranked]:
        return [row for row in self.ranked if not row.refused]

    def why(self) -> str:
        chosen, others = self.chosen, len(self.fitting) - 1
        step = chosen.step.describe() if chosen.step is not None else ""
        against = f" of the {others + 1} layouts that fit" if others else ", the one layout that fits"
        return f"{chosen.candidate.words} ({chosen.candidate.text}): the fastest modelled step{against}, {step}"

    def table(self) -> str:
        count = f"{len(self.ranked)} layout{'s' if len(self.ranked) != 1 else ''}"
        lines = [f"strategy=auto: {count} ({self.memory}; step time from {self.rates.source}):"]
        for place, row in enumerate(self.fitting, 1):
            step = row.step.describe() if row.step is not None else ""
            lines.append(f"  {place:>2}. {row.candidate.words:<28} {step:<44} {row.memory:<24} {row.candidate.text}")
        lines += [f"   -. {row.candidate.words:<28} set aside: {row.refused}" for row in self.ranked if row.refused]
        return "\n".join([*lines, f"  chosen: {self.why()}"])

    def record(self) -> Dict[str, Any]:
        return {
            "chosen": self.chosen.record(),
            "why": self.why(),
            "rates": self.rates.source,
            "memory": self.memory,
            "layouts": [row.record() for row in self.ranked],
        }


def planned(
    cfg: Union[DictConfig, ConfigView],
    run_dir: Path,
    overrides: Optional[Sequence[str]] = None,
    choices: Optional[Dict[str, str]] = None,
) -> Tuple[RunPlan, Dict[str, Any], Optional[Choice]]:
    """The job's plan and job spec; with strategy=auto, the chosen layout's, and the Choice (None otherwise).
    `overrides`: the job's own (a sweep's job); default: the running Hydra app's. `choices`: its config groups'
    options, which the job spec records (hpc-train's own job: none given)."""
    view = cfg if isinstance(cfg, ConfigView) else checked_view(cfg)
    if strategy_id(view.strategy) != AUTO:
        plan = make_plan(view, run_dir)
        return plan, build_job_spec(plan, choices), None
    choice = choose(view, run_dir, overrides)
    spec = choice.chosen.spec
    assert spec is not None, "a layout that fits was composed into its job spec"
    config = {key: value for key, value in spec.items() if key not in SPEC_ONLY}
    return make_plan(ConfigView(config), run_dir), spec, choice


def check_before_forwarding(view: ConfigView, run_dir: Path, choices: Optional[Dict[str, str]] = None) -> None:
    """Every refusal this side can make of a job it forwards to the cluster's hpc-train (cluster.login), before any
    byte is sent; a strategy=auto job's layout is chosen there, whose Python runs the estimate."""
    if strategy_id(view.strategy) != AUTO:
        build_job_spec(make_plan(view, run_dir), choices)


def choose(view: ConfigView, run_dir: Path, overrides: Optional[Sequence[str]] = None) -> Choice:
    """The candidates estimated and ranked; ConfigError for a script job and where none can run. `overrides`: the
    job's own (default: the running Hydra app's), which each candidate's are composed over."""
    if is_script_job(view):
        raise ConfigError(
            "strategy",
            "strategy=auto chooses how hpc_train's trainer lays out the model, but a script job's script lays out its"
            " own ranks.",
            "pick the layout your script expects, e.g. strategy=ddp (one rank per GPU).",
        )
    settings = view.strategy
    candidates = layout_candidates(view, _mesh_option(str(settings.mesh), run_dir), tuple(settings.search))
    if not candidates:
        raise ConfigError(
            "strategy.search",
            f"no layout of the kinds {list(settings.search)} is valid for this job's nodes, GPUs and batch.",
            "widen strategy.search (ddp, fsdp, hsdp, tp, pp), or change resources.gpus_per_node or trainer.batch_size.",
        )
    specs = fit_specs.specs_for([candidate.overrides for candidate in candidates], run_dir, overrides)
    estimates = memory_check.estimates(specs, costs=True)
    memory = memory_check.wanted(view, specs[0])
    rates = _rates(view, candidates[0].parallel)
    rows = [_ranked(c, spec, answer, memory, rates) for c, spec, answer in zip(candidates, specs, estimates)]
    fitting = sorted((row for row in rows if not row.refused), key=lambda row: row.step.total if row.step else 0.0)
    words = f"held to {size_text(memory.usable_bytes)} ({memory.source})" if memory else _UNCHECKED
    choice = Choice([*fitting, *(row for row in rows if row.refused)], rates, words)
    if not fitting:
        raise ConfigError(
            "strategy",
            "strategy=auto found no layout it can run:\n" + choice.table().rsplit("\n", 1)[0] + "\n",
            "fix what the lines above say (the first, when the estimate cannot trace the model), or pick a layout.",
        )
    return choice


_UNCHECKED = "memory not held to a GPU's: none known (cluster.gpu_type, cluster.gpu_memory_gb), every layout fits"


def _mesh_option(name: str, run_dir: Path) -> Tuple[str, Mapping[str, Any]]:
    """(strategy.mesh's option, its composed node): the shipped mesh, or the user's option composed over the job."""
    if name == "mesh":
        return name, shipped_strategy("mesh")
    [spec] = fit_specs.specs_for([(f"strategy={name}", *_MESH_ALONE)], run_dir)
    node = {key: value for key, value in spec["strategy"].items() if key != "stages"}
    if node.get("name") != "mesh":
        raise ConfigError(
            "strategy.mesh",
            f"names strategy={name}, which is strategy={node.get('name')}, not a mesh.",
            "name a mesh option (defaults: [mesh, _self_] with your tp_plan), or strategy.mesh=mesh.",
        )
    return name, node


def _rates(view: ConfigView, parallel: Optional[Parallelism]) -> Rates:
    """The cost model's rates for this job; CPU workers on this machine share its cores when they outnumber them."""
    on_cpus = launcher_kind(view.launcher.name).on_this_machine and count_local_gpus() == 0
    world = parallel.layout.world_size if parallel is not None else 1
    shared = on_cpus and world > (os.cpu_count() or world)
    precision = normalize_precision(view.trainer.precision)
    return rates_for(view.cluster, precision, float(view.strategy.efficiency), on_cpus, shared)


def _ranked(candidate: Candidate, spec: Dict[str, Any], answer: fit_run.Estimate, memory: Any, rates: Rates) -> Ranked:
    """The candidate's row: refused by the estimate, too large for the GPU, or its step time and memory."""
    if isinstance(answer, fit_run.Refused):
        return Ranked(candidate, spec, refused=answer.reason)
    parallel = candidate.parallel
    pp = parallel.dims.pp if parallel is not None and parallel.dims is not None else 1
    step = step_time(answer["ranks"], rates, pp, parallel.chunks if parallel is not None else 1)
    if memory is None:
        peak = max(int(rank["peak"]) for rank in answer["ranks"])
        return Ranked(candidate, spec, step, f"peak {peak / 2**20:.1f} MiB")
    fit = memory_check.fit_of(answer, memory, spec)
    if not fit.fits:
        return Ranked(candidate, spec, step, fit.share_text(), f"does not fit: needs {fit.share_text()}")
    return Ranked(candidate, spec, step, fit.share_text())
