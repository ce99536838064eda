"""The strategy interface: where the model lives, how it is wrapped, how one step runs.

A strategy owns three decisions and nothing else:

* placement and wrapping of the model on the task's devices (``wrap``),
* which data shard this rank reads (``data_parallel_rank`` / ``data_parallel_size``),
* how a batch goes forward and backward (``forward_backward``, ``predict``).

The trainer is written against this interface only, so new strategies plug in without
touching the loop. Job layouts (tasks, GPUs per task) are declared on the launch side in
``hpc_train.launch.layout``, because the login node must know them without torch.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Tuple

import torch
import torch.nn as nn

from hpc_train import rundir
from hpc_train.compute import distributed
from hpc_train.compute.batch import batch_size
from hpc_train.compute.precision import autocast, grad_scaler
from hpc_train.compute.ranks import RankInfo
from hpc_train.compute.step import SupervisedStep, is_builtin, split_result


class Strategy:
    name = "base"

    def __init__(
        self, cfg, ranks: RankInfo, devices: List[torch.device], precision: str, loss_fn: Optional[Callable] = None
    ) -> None:
        self.cfg = cfg
        self.ranks = ranks
        self.devices = devices
        self.precision = precision
        self.loss_fn: Callable = loss_fn or nn.CrossEntropyLoss()  # trainer.loss; pipeline schedules call it themselves
        self.step: Callable = SupervisedStep(self.loss_fn)  # trainer.step (the trainer sets both)
        self.metric_names: List[str] = []  # the metrics the user's step returns besides its loss

    # -- placement --------------------------------------------------------------------
    needs_example = False  # True: wrap() needs an example input batch (time balancing, shape inference)
    supports_compile = True  # trainer.compile wraps the module returned by wrap()

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
        self, model: nn.Module, batch: Any, scaler: Optional["torch.amp.GradScaler"]
    ) -> Tuple[torch.Tensor, Dict[str, torch.Tensor]]:
        """One forward and backward pass of the training step; this rank's loss and metrics (detached)."""
        with autocast(self.precision, self.input_device):
            loss, metrics = split_result(self.step(model, batch), self.reduce_replicas)
        (scaler.scale(loss) if scaler is not None else loss).backward()
        return loss.detach(), {name: value.detach() for name, value in metrics.items()}

    def reduce_replicas(self, value: Any) -> Any:
        """One value from what the wrapped model returned (nn.DataParallel returns one per GPU)."""
        return value

    def predict(self, model: nn.Module, images: torch.Tensor) -> torch.Tensor:
        with autocast(self.precision, self.input_device):
            return model(images)

    def eval_counts(self, model: nn.Module, batch: Any) -> torch.Tensor:
        """Sums over one evaluation batch, float64 on the CPU: (correct, samples, loss, classified, *metrics).

        Summed over batches and ranks later, then divided by the samples: the loss (a mean over
        the batch) and each metric of the user's step are weighted by the batch size; accuracy
        counts only the built-in step's batches of class logits against integer labels.
        """
        if not is_builtin(self.step):
            with autocast(self.precision, self.input_device):
                loss, metrics = split_result(self.step(model, batch), self.reduce_replicas)
            count = batch_size(batch)
            sums = [float(loss) * count, *(float(metrics[name]) * count for name in self.metric_names)]
            return torch.tensor([0, count, sums[0], 0, *sums[1:]], dtype=torch.float64)
        from hpc_train.compute.user_code import is_classification

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
