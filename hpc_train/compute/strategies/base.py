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

from typing import Callable, List, Optional

import torch
import torch.nn as nn

from hpc_train import rundir
from hpc_train.compute import distributed
from hpc_train.compute.precision import autocast
from hpc_train.compute.ranks import RankInfo


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
    def forward_backward(
        self,
        model: nn.Module,
        images: torch.Tensor,
        labels: torch.Tensor,
        loss_fn: nn.Module,
        scaler: Optional["torch.amp.GradScaler"],
    ) -> torch.Tensor:
        """One forward and backward pass; returns this rank's mean loss (detached)."""
        with autocast(self.precision, self.input_device):
            outputs = model(images)
            loss = loss_fn(outputs, labels.to(outputs.device, non_blocking=True))
        (scaler.scale(loss) if scaler is not None else loss).backward()
        return loss.detach()

    def predict(self, model: nn.Module, images: torch.Tensor) -> torch.Tensor:
        with autocast(self.precision, self.input_device):
            return model(images)

    def eval_counts(self, model: nn.Module, images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """(correct, samples, summed loss, classified samples) of one evaluation batch, float64 on the CPU.

        Summed over batches and ranks later: the loss is trainer.loss (a mean over the batch)
        times the batch size; accuracy counts only batches of class logits against integer labels.
        """
        from hpc_train.compute.user_code import is_classification

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

    # -- checkpoints ------------------------------------------------------------------
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
