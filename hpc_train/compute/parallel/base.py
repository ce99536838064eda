"""The strategy interface: where the model lives, how it is wrapped, how one step runs.

A strategy owns three decisions and nothing else:

* placement and wrapping of the model on the task's devices (``wrap``),
* which data shard this rank reads (``data_parallel_rank`` / ``data_parallel_size``),
* how a batch goes forward and backward (``forward_backward``, ``predict``).

The trainer is written against this interface only, so new strategies plug in without
touching the loop. Job layouts (tasks, GPUs per task) are declared on the launch side in
``hpc_train.launch.planning.layout``, because the login node must know them without torch.
"""

from __future__ import annotations

import contextlib
from dataclasses import asdict, dataclass
from typing import Any, Callable, ContextManager, Dict, Iterable, List, Optional, Sequence, Tuple

import torch
import torch.nn as nn

from hpc_train.compute.data.batch import batch_size, split_batch
from hpc_train.compute.parallel.gradients import clip_to_norm, total_norm
from hpc_train.compute.parallel.precision import autocast, grad_scaler
from hpc_train.compute.runtime import distributed, heartbeat
from hpc_train.compute.runtime.ranks import RankInfo
from hpc_train.compute.user.building import is_classification
from hpc_train.compute.user.step import SupervisedStep, is_builtin, split_result
from hpc_train.config.strategy import strategy_id
from hpc_train.contracts.job_layout import JobLayout
from hpc_train.records import hang, rundir

TOKENS = "tokens"  # a step's metric that counts (tokens of the batch): summed over micro-batches, not averaged


@dataclass(frozen=True)
class StrategySettings:
    """The ``strategy`` keys of every strategy; a strategy with keys of its own (``only`` in
    hpc_train.config.strategy) reads a subclass that adds them (``Strategy.settings_type``)."""

    name: str
    backend: str

    @property
    def node(self) -> Dict[str, Any]:
        """These settings as the strategy node hpc_train.contracts.strategy_table reads (both sides share its
        functions)."""
        return asdict(self)

    @property
    def identity(self) -> str:
        return strategy_id(self.node)


@dataclass(frozen=True)
class StrategySetup:
    """What a strategy is built from, as build_strategy and every Strategy take it: its settings, the trainer's
    precision and compile flag, this rank and its devices, the user's loss and step (None: cross-entropy, and the
    built-in step of that loss), the names of the metrics the step returns besides its loss, and the job's layout
    (the mesh's resolved dimensions)."""

    settings: StrategySettings
    ranks: RankInfo
    devices: List[torch.device]
    precision: str  # trainer.precision
    compile_blocks: bool  # trainer.compile, where a strategy compiles blocks itself (fsdp)
    loss_fn: Optional[Callable]
    step: Optional[Callable]
    metric_names: Sequence[str]
    layout: JobLayout


class Strategy:
    name = "base"
    settings_type = StrategySettings  # the settings class this strategy reads (a subclass adds its own keys)

    def __init__(self, setup: StrategySetup) -> None:
        self.settings = setup.settings
        self.ranks = setup.ranks
        self.devices = setup.devices
        self.precision = setup.precision
        # trainer.loss (pipeline schedules call it themselves) and trainer.step (None: the built-in step)
        self.loss_fn: Callable = nn.CrossEntropyLoss() if setup.loss_fn is None else setup.loss_fn
        self.step: Callable = SupervisedStep(self.loss_fn) if setup.step is None else setup.step
        self.metric_names: List[str] = list(setup.metric_names)  # the metrics the user's step returns besides its loss
        self.compile_blocks = bool(setup.compile_blocks)

    # -- placement --------------------------------------------------------------------
    needs_example = False  # True: wrap() needs an example input batch (time balancing, shape inference)
    supports_compile = True  # trainer.compile wraps the module returned by wrap()
    compiled_blocks = False  # True once wrap() compiled the model's blocks itself (before sharding them)

    @property
    def input_device(self) -> torch.device:
        return self.devices[0]

    def wrap(self, model: nn.Module, example: Optional[torch.Tensor] = None) -> nn.Module:
        """Place and wrap the model; `example` is a small input batch (for time-based balancing)."""
        return model.to(self.input_device)

    def unwrap(self, model: nn.Module) -> nn.Module:
        """The plain module whose state_dict is checkpointed."""
        return model

    # -- data sharding ----------------------------------------------------------------
    @property
    def data_parallel_size(self) -> int:
        return 1

    @property
    def data_parallel_rank(self) -> int:
        return 0

    # -- compute ----------------------------------------------------------------------
    def settle(self, model: nn.Module, batch: Any) -> None:
        """Called with the first batch of every attempt (fresh or resumed), before its first step; default: nothing."""

    def forward_backward(
        self, model: nn.Module, batch: Any, scaler: Optional["torch.amp.GradScaler"], loss_weight: float = 1.0
    ) -> Tuple[torch.Tensor, Dict[str, torch.Tensor]]:
        """One forward and backward pass of the training step; this rank's loss and metrics (detached).

        The gradients are those of ``loss_weight * loss``: a micro-batch's share of its batch.
        """
        heartbeat.mark(hang.FORWARD)
        with autocast(self.precision, self.input_device):
            loss, metrics = split_result(self.step(model, batch), self.reduce_replicas)
        heartbeat.mark(hang.BACKWARD)
        weighted = loss if loss_weight == 1.0 else loss * loss_weight
        (scaler.scale(weighted) if scaler is not None else weighted).backward()
        return loss.detach(), {name: value.detach() for name, value in metrics.items()}

    def accumulate(
        self, model: nn.Module, batch: Any, scaler: Optional["torch.amp.GradScaler"], micro_batches: int
    ) -> Tuple[torch.Tensor, Dict[str, torch.Tensor]]:
        """Forward and backward over `batch` cut into `micro_batches` (``trainer.grad_accum_steps``).

        Each micro-batch's loss is weighted by its share of the batch, so the summed gradients
        are those of the whole batch's mean loss; gradients are synchronised across ranks only
        on the last one (:meth:`no_sync`). Returns the batch's loss and metrics (share-weighted
        means; a ``tokens`` count is summed).
        """
        if micro_batches == 1:
            return self.forward_backward(model, batch, scaler)
        pieces = split_batch(batch, micro_batches)
        total = sum(batch_size(piece) for piece in pieces)
        loss_sum: Optional[torch.Tensor] = None
        metric_sums: Dict[str, torch.Tensor] = {}
        for index, piece in enumerate(pieces):
            weight = batch_size(piece) / total
            last = index == len(pieces) - 1
            with contextlib.nullcontext() if last else self.no_sync(model):
                loss, metrics = self.forward_backward(model, piece, scaler, weight)
            loss_sum = loss * weight if loss_sum is None else loss_sum + loss * weight
            for name, value in metrics.items():
                share = value if name == TOKENS else value * weight
                metric_sums[name] = share if name not in metric_sums else metric_sums[name] + share
        return loss_sum, metric_sums

    def no_sync(self, model: nn.Module) -> ContextManager:
        """Gradients accumulate locally inside the block (no all-reduce); default: nothing to skip."""
        return contextlib.nullcontext()

    def grad_norm(self, model: nn.Module, max_norm: Optional[float] = None) -> torch.Tensor:
        """The total L2 norm of all of the model's gradients (over every rank's part of the model), before
        clipping; with `max_norm`, the gradients are then scaled so that their total norm is at most that."""
        params = [p for p in model.parameters() if p.grad is not None]
        norm = self.global_norm(total_norm([p.grad for p in params], self.input_device))
        if max_norm is not None:
            clip_to_norm(params, float(max_norm), norm)
        return norm

    def global_norm(self, local_norm: torch.Tensor) -> torch.Tensor:
        """The norm over the whole model from this rank's part's norm: replicas hold it all (default)."""
        return local_norm

    def reduce_replicas(self, value: Any) -> Any:
        """One value from what the wrapped model returned (nn.DataParallel returns one per GPU)."""
        return value

    def predict(self, model: nn.Module, images: torch.Tensor) -> torch.Tensor:
        with autocast(self.precision, self.input_device):
            return model(images)

    def evaluate(self, model: nn.Module, batches: Iterable[Any]) -> Dict[str, Optional[float]]:
        """The step's loss and metrics over `batches` (this rank's share of data.val, on the input device) and
        every other rank's: ``{"accuracy", "loss", "samples", *metric_names}`` (every rank calls it: a collective).

        Each batch's :meth:`eval_counts` are summed, then summed over the ranks, then divided by the
        samples: the loss and each metric are weighted by batch size; accuracy is None unless every
        batch was the built-in step's class logits against integer labels.
        """
        totals = torch.zeros(4 + len(self.metric_names), dtype=torch.float64)  # the layout of eval_counts
        for batch in batches:
            totals += self.eval_counts(model, batch)
        totals = distributed.all_reduce_sum(totals.to(distributed.collective_device(self.input_device))).cpu()
        correct, samples, loss, classified = (totals[i].item() for i in range(4))
        count = max(1.0, samples)
        accuracy = correct / count if classified == samples > 0 else None
        metrics = {name: totals[4 + i].item() / count for i, name in enumerate(self.metric_names)}
        return {"accuracy": accuracy, "loss": loss / count, "samples": int(samples), **metrics}

    def eval_counts(self, model: nn.Module, batch: Any) -> torch.Tensor:
        """Sums over one evaluation batch, float64 on the CPU: (correct, samples, loss, classified, *metrics).

        Summed over batches and ranks by :meth:`evaluate`, then divided by the samples: the loss (a
        mean over the batch) and each metric of the user's step are weighted by the batch size;
        accuracy counts only the built-in step's batches of class logits against integer labels.
        """
        if not is_builtin(self.step):
            with autocast(self.precision, self.input_device):
                loss, metrics = split_result(self.step(model, batch), self.reduce_replicas)
            count = batch_size(batch)
            sums = [float(loss) * count, *(float(metrics[name]) * count for name in self.metric_names)]
            return torch.tensor([0, count, sums[0], 0, *sums[1:]], dtype=torch.float64)
        images, labels = batch
        outputs = self.predict(model, images).float()
        labels = labels.to(outputs.device)
        count = outputs.shape[0]
        loss = float(self.loss_fn(outputs, labels)) * count
        if is_classification(outputs, labels):
            return torch.tensor(
                [(outputs.argmax(dim=1) == labels).sum().item(), count, loss, count], dtype=torch.float64
            )
        return torch.tensor([0, count, loss, 0], dtype=torch.float64)

    def global_loss(self, loss: torch.Tensor) -> float:
        """This step's loss over the global batch (every rank calls it: it may be a collective)."""
        return distributed.all_reduce_mean(
            loss.float().reshape(1).to(distributed.collective_device(self.input_device))
        ).item()

    def global_metrics(self, metrics: Dict[str, torch.Tensor]) -> Dict[str, float]:
        """The step's metrics averaged over the global batch (every rank calls it, with the same names)."""
        if not self.metric_names:
            return {}
        device = distributed.collective_device(self.input_device)
        values = torch.stack([metrics[name].detach().float().reshape(()).to(device) for name in self.metric_names])
        return dict(zip(self.metric_names, distributed.all_reduce_mean(values).tolist()))

    def make_grad_scaler(self) -> Optional["torch.amp.GradScaler"]:
        """fp16 needs loss scaling; bf16 and fp32 do not."""
        return grad_scaler(self.precision, self.input_device)

    def final_state_dict(self, model: nn.Module) -> Dict[str, torch.Tensor]:
        """The whole model's final weights where this rank holds them (every rank calls it: it may be a collective)."""
        return self.unwrap(model).state_dict()

    # -- checkpoints ------------------------------------------------------------------
    sharded_checkpoints = False  # True: torch.distributed.checkpoint directories (fsdp) instead of one file

    @property
    def checkpoint_key(self) -> str:
        """Which part of the model this rank's parameters are, in a checkpoint's shards."""
        return "model"

    @property
    def owns_checkpoint_shard(self) -> bool:
        """True on the one rank that saves `checkpoint_key`'s model/optimizer state (replicas hold copies)."""
        return self.ranks.is_main

    def weights_file(self) -> Optional[str]:
        """Where this rank writes its final weights (None: it writes none). Rank 0 holds the whole model."""
        return rundir.WEIGHTS if self.ranks.is_main else None
