"""The estimate: one rank's training step simulated on fake tensors in a fake world, its peak memory tracked.

For rank r of the job's world, :func:`estimate_rank` does what that rank's trainer does, with the project's own
parts (hpc_train.compute.user, .parallel, .training), so the user's model, loss, step and tensor-parallel plan are
estimated as they run:

1. the fake world of the job's size as rank r (:mod:`hpc_train.compute.fit.fake_world`), the strategy built in it
   (its device mesh made here, on real rank lists);
2. one real batch of the job's data, this rank's share of the global batch (its data shard), made fake;
3. on fake tensors: the model built from its ``model`` node, activation checkpointing as the trainer applies it, the
   strategy's wrapping (pipeline cut, tensor parallel, FSDP2; DDP simulated with its gradient buckets,
   :mod:`hpc_train.compute.fit.replicas`), the optimizer and its parameter groups with the kernels torch picks on
   the job's device (``--device``: on GPUs, the foreach kernels), the weight average;
4. the optimizer's state made as its first step makes it (each parameter given a zero gradient, one step, the
   gradients dropped), untracked: a step with it weighs what a second step weighs, without simulating two;
5. one training step under torch's memory tracker (FSDPMemTracker where FSDP2 wraps the model), as a step after the
   first runs: gradients zeroed, the strategy's forward and backward over the accumulation's micro-batches, the
   gradient norm, the optimizer's step. Its peak is the rank's.

What is not counted: the device's own overhead (CUDA context, the allocator's cache and fragmentation), compiled
code's buffers (``trainer.compile`` is estimated eager), and what a loss scaler adds for fp16 (a few scalars).
An operation whose output depends on the data cannot run on fake tensors: the estimate is refused, naming the module.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

import torch
import torch.nn as nn
from omegaconf import DictConfig

from hpc_train.compute.data.batch import to_device
from hpc_train.compute.data.loaders import DataSettings, data_shard_for
from hpc_train.compute.fit import replicas
from hpc_train.compute.fit.breakdown import JobEstimate, RankEstimate, from_snapshot
from hpc_train.compute.fit.costs import StepCosts, counting
from hpc_train.compute.fit.fake_world import fake_mode, fake_world, untraceable
from hpc_train.compute.fit.trackers import peak_snapshot, tracker_for
from hpc_train.compute.parallel import build_strategy, rank_data_shard, strategy_class
from hpc_train.compute.parallel.base import Strategy, StrategySettings, StrategySetup
from hpc_train.compute.replicas.settings import replica_settings
from hpc_train.compute.runtime.refusal import Refusal
from hpc_train.compute.settings import JobSettings, section
from hpc_train.compute.training.activation_checkpointing import checkpoint_blocks
from hpc_train.compute.training.ema import WeightAverage
from hpc_train.compute.training.optim import OptimSettings, make_optimizer, param_groups
from hpc_train.compute.training.settings import TrainerSettings
from hpc_train.compute.user.building import build_datasets, build_loss, build_model, collate
from hpc_train.compute.user.step import build_step
from hpc_train.config.strategy import strategy_id
from hpc_train.contracts.job_layout import JobLayout, group_layout
from hpc_train.contracts.mesh_dims import MeshDims

STEPS = 1  # tracked, with the optimizer's state made before (with_state): as the second step of a run
# The strategies (their identity, hpc_train.config.strategy.strategy_id) the estimate simulates; nn.DataParallel's
# and the single-process pipelines' device placement (several devices in one process) do not run on fake tensors yet.
ESTIMATED = ("single", "fsdp", "mesh", "ddp")
# Where the estimated job's ranks run: GPUs (what the memory check and strategy=auto ask about), or CPUs (as the
# estimate's comparison with measured CPU runs does).
DEVICES = ("gpu", "cpu")


@dataclass(frozen=True)
class EstimateSettings:
    """What the estimate reads of a completed job spec: the model node, the loop's keys (batch, precision,
    activation checkpointing, loss and step), optimisation's, the strategy's, the layout and the data."""

    model: Mapping[str, Any]
    trainer: TrainerSettings
    optim: OptimSettings
    strategy: StrategySettings
    layout: JobLayout
    data: DataSettings
    device: str = DEVICES[0]  # where the job's ranks run: what torch picks there is simulated (kernels_as_on)
    groups: int = 1  # fault_tolerance.replica_groups: `layout` is then one group's, which reads 1/groups of the data

    @classmethod
    def from_job_spec(cls, spec: DictConfig, device: str = DEVICES[0]) -> "EstimateSettings":
        """What the estimate reads of `spec`; a job of replica groups as one group's ranks run it (a job of its own
        to torch, its layout the group's), each reading its share of the whole job's data."""
        assert device in DEVICES, device
        layout, replica = section(JobSettings, spec.job).layout, replica_settings(spec)
        groups = 1 if replica is None else int(replica.replica_groups)
        return cls(
            model=spec.model,
            trainer=section(TrainerSettings, spec.trainer),
            optim=section(OptimSettings, spec.trainer),
            strategy=section(strategy_class(strategy_id(spec.strategy)).settings_type, spec.strategy),
            layout=group_layout(layout, groups),
            data=section(DataSettings, spec.data),
            device=device,
            groups=groups,
        )


def estimate_job(settings: EstimateSettings, ranks: Optional[Sequence[int]] = None, costs: bool = False) -> JobEstimate:
    """The estimate of `ranks` (default: one per pipeline stage, the ranks of a stage holding the same); with `costs`,
    each rank's step costs too (one more simulated step: strategy=auto's cost model reads them, the memory check
    does not)."""
    check_simulated(settings)
    started = time.perf_counter()
    chosen = list(ranks) if ranks is not None else representative_ranks(settings.layout)
    estimates = [estimate_rank(settings, rank, costs) for rank in chosen]
    return JobEstimate(settings.layout.describe(on_cpus=True), estimates, time.perf_counter() - started)


def check_simulated(settings: EstimateSettings) -> None:
    """Refusal for a strategy the estimate does not simulate."""
    if settings.strategy.identity not in ESTIMATED:
        raise Refusal(
            f"`strategy`: the memory estimate does not simulate strategy={settings.strategy.identity} yet; it"
            f" simulates {', '.join(ESTIMATED)}. Fix: estimate the job as strategy=ddp (a replica a rank) or"
            " strategy=mesh with the same layout, or run it without the estimate."
        )


def representative_ranks(layout: JobLayout) -> List[int]:
    """The first rank of each pipeline stage (rank 0 alone without stages)."""
    if layout.strategy == "mesh" and layout.mesh is not None:
        dims = MeshDims(*layout.mesh)
        firsts: Dict[int, int] = {}
        for rank in range(dims.world_size):
            firsts.setdefault(dims.coordinates(rank)["pp"], rank)
        return [firsts[stage] for stage in sorted(firsts)]
    return list(range(layout.stages))  # the pipelining engine's stages are its first ranks; else rank 0


def estimate_rank(settings: EstimateSettings, rank: int, costs: bool = False) -> RankEstimate:
    """Rank `rank`'s peak memory over :data:`STEPS` simulated training steps (and its step's costs, with `costs`)."""
    with fake_world(settings.layout, rank) as ranks:
        shard = rank_data_shard(settings.layout, ranks)
        batch = _real_batch(settings, (shard[0], shard[1] * settings.groups))  # group 0's share of the job's data
        strategy = _strategy(settings, ranks, shard)
        with fake_mode() as mode:
            batch = to_device(_faked(mode, batch), strategy.input_device)
            model, names = _model(settings, strategy, batch)
            counted = StepCosts() if costs else None
            snapshot = _tracked_steps(settings, strategy, model, batch, names, counted)
    stage, coordinates = _place(strategy)
    return from_snapshot(snapshot, rank, stage, coordinates, counted)


def _real_batch(settings: EstimateSettings, shard: Tuple[int, int]) -> Any:
    """This rank's batch of the job's data (the global batch over the data-parallel ranks), as the trainer reads it;
    made once per process for each data section, shard and size (the ranks and settings of one job share it)."""
    per_rank = int(settings.trainer.batch_size) // shard[1]
    key = repr((settings.data, shard, per_rank))
    if key not in _batches:
        with data_shard_for(*shard):  # a stream shards itself by it; this process is no rank after the estimate
            _batches[key] = collate(build_datasets(settings.data), per_rank)
    return _batches[key]


_batches: Dict[str, Any] = {}  # the real batches this process has made, by _real_batch's key


def _faked(mode: Any, batch: Any) -> Any:
    """`batch` with each tensor replaced by its fake (same shape, dtype and device)."""
    if isinstance(batch, torch.Tensor):
        return mode.from_tensor(batch)
    if isinstance(batch, (list, tuple)):
        return type(batch)(_faked(mode, item) for item in batch)
    if isinstance(batch, dict):
        return {key: _faked(mode, value) for key, value in batch.items()}
    return batch


def _strategy(settings: EstimateSettings, ranks: Any, shard: Tuple[int, int]) -> Strategy:
    """The job's strategy for this rank, built as the trainer builds it (the device mesh made here, before fake
    tensors are on)."""
    trainer = settings.trainer
    loss_fn = build_loss(trainer.loss)
    setup = StrategySetup(
        settings.strategy,
        ranks,
        [torch.device("cpu")],
        str(trainer.precision),
        False,  # trainer.compile: estimated eager
        loss_fn,
        build_step(trainer.step, loss_fn),
        [],
        settings.layout,
    )
    return build_strategy(setup, shard)


def _model(settings: EstimateSettings, strategy: Strategy, batch: Any) -> Tuple[nn.Module, "ModulePath"]:
    """The user's model on fake tensors, checkpointed and wrapped as the trainer does; the path to the module
    running, for a refusal."""
    with _named_untraceable(None):
        model = build_model(settings.model)
    names = ModulePath(model)
    if str(settings.trainer.activation_checkpointing) == "blocks":
        checkpoint_blocks(model)
    example = batch[0] if isinstance(batch, (list, tuple)) else batch
    with _named_untraceable(names):
        if replicas.simulated(strategy):  # DDP does not run on fake tensors: its buckets simulated
            wrapped = replicas.wrap(strategy, model)
        else:
            wrapped = strategy.wrap(model, example if strategy.needs_example else None)
    return wrapped, names


def _tracked_steps(
    settings: EstimateSettings,
    strategy: Strategy,
    model: nn.Module,
    batch: Any,
    names: "ModulePath",
    costs: Optional[StepCosts] = None,
) -> Mapping[str, int]:
    """The peak snapshot (category -> bytes) over :data:`STEPS` training steps; then one more step, untracked, its
    FLOPs and collectives counted into `costs` (:mod:`hpc_train.compute.fit.costs`): the FLOP counter's own
    bookkeeping under activation checkpointing would otherwise be counted in the peak."""
    optim = settings.optim
    plain = strategy.unwrap(model)
    optimizer = with_state(kernels_as_on(settings.device, make_optimizer(optim, param_groups(optim, plain))))
    ema = WeightAverage(plain, float(optim.ema_decay)) if optim.ema_decay is not None else None
    once = int(optim.grad_accum_steps) == 1 and not getattr(strategy, "pipelined", False)
    tracker = tracker_for(model, optimizer, batch, once)
    step = _training_step(strategy, model, optimizer, batch, int(optim.grad_accum_steps), ema)
    with _named_untraceable(names), tracker:
        for _ in range(STEPS):
            step()
            tracker.reset_mod_stats()
    if costs is not None:
        with _named_untraceable(names), counting(costs, settings.layout.gpus_per_node):
            step()
    return peak_snapshot(tracker)


def kernels_as_on(device: str, optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
    """`optimizer` stepping with the kernels torch picks where the job runs. On GPUs, an optimizer left to choose
    (``foreach=None``, not fused) takes the foreach kernels, whose step holds a temporary the size of its state (Adam's
    square roots of every second moment at once); on the fake CPU tensors it would take the per-tensor loop, which
    holds one at a time. A job on CPUs keeps the loop, as torch picks there."""
    if device != "gpu":
        return optimizer
    for group in optimizer.param_groups:
        if "foreach" in group and group["foreach"] is None and not group.get("fused"):
            group["foreach"] = True
    return optimizer


def with_state(optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
    """`optimizer` with the state its first step makes (every parameter given a zero gradient, one step, the
    gradients dropped), so that the one tracked step weighs what a run's later steps weigh."""
    for group in optimizer.param_groups:
        for param in group["params"]:
            if param.requires_grad:
                param.grad = torch.zeros_like(param)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return optimizer


def _training_step(
    strategy: Strategy, model: nn.Module, optimizer: Any, batch: Any, micro_batches: int, ema: Any
) -> Callable[[], None]:
    """The trainer's step (hpc_train.compute.training.trainer.Trainer.train_step) as the memory sees it: no loss
    scaler (its checks read values), the norm taken without clipping (clipping scales in place)."""

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        strategy.accumulate(model, batch, None, micro_batches)
        strategy.grad_norm(model, None)
        optimizer.step()
        if ema is not None:
            ema.update()

    return step


def _place(strategy: Strategy) -> Tuple[Optional[int], Dict[str, int]]:
    """(pipeline stage or None, mesh coordinates) of the strategy's rank."""
    at = dict(getattr(strategy, "at", {}) or {})
    if at:
        return (at["pp"] if getattr(strategy, "pipelined", False) else None), at
    stage = getattr(strategy, "stage_index", None)
    return stage, ({"stage": stage} if stage is not None else {})


class ModulePath:
    """The model's modules that are running now, outermost first (forward hooks on every module)."""

    def __init__(self, model: nn.Module) -> None:
        self.running: List[str] = []
        for name, module in model.named_modules():
            module.register_forward_pre_hook(lambda _m, _a, n=name: self._enter(n))
            module.register_forward_hook(lambda _m, _a, _o: self._leave())

    def _enter(self, name: str) -> None:
        self.running.append(name)

    def _leave(self) -> None:
        if self.running:
            self.running.pop()

    @property
    def innermost(self) -> str:
        return next((name for name in reversed(self.running) if name), "")


class _named_untraceable:
    """An operation fake tensors cannot run becomes a Refusal naming the module that ran it."""

    def __init__(self, names: Optional[ModulePath]) -> None:
        self.names = names

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: Any, error: Any, _tb: Any) -> bool:
        if error is None or not isinstance(error, untraceable()):
            return False
        where = self.names.innermost if self.names is not None else ""
        module = f"module {where!r}" if where else "the model's construction or its top-level forward"
        raise Refusal(
            f"the memory estimate cannot trace {module}: {type(error).__name__} ({str(error).splitlines()[0]}), an"
            " operation whose result depends on the data's values, which the estimate does not have. Fix: make the"
            " module's shapes depend on the input's shapes only (no .item(), no branch on a tensor's value), or run"
            " the job without the estimate."
        ) from error
