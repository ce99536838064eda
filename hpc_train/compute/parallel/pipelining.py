"""`pipeline` with `strategy.engine=pipelining`: one rank per stage on torch.distributed.pipelining.

World = D x S ranks: rank r holds stage ``r % S`` of data-parallel replica ``r // S`` (on Slurm,
one task per GPU, so consecutive GPUs of a node form a pipeline and pipelines can span nodes).
Micro-batches go through ``ScheduleGPipe`` or ``Schedule1F1B`` (``strategy.schedule``); each
stage's gradients are averaged over the D replicas of that stage. Unlike the single-process
pipeline, activations cross process (and node) boundaries by point-to-point messages.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Optional, Tuple

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

from hpc_train.compute.parallel.base import Strategy, StrategySetup
from hpc_train.compute.parallel.partitioning import micro_batch
from hpc_train.compute.parallel.pipeline import PipelineSettings
from hpc_train.compute.parallel.precision import autocast
from hpc_train.compute.parallel.schedule_step import schedule_step
from hpc_train.compute.parallel.staged_model import split_model
from hpc_train.compute.parallel.tracing import stage_inputs
from hpc_train.compute.runtime import distributed
from hpc_train.contracts.strategy_table import split_settings
from hpc_train.records import rundir

_DTYPES = [
    torch.float32,
    torch.float64,
    torch.float16,
    torch.bfloat16,
    torch.int64,
    torch.int32,
    torch.bool,
    torch.uint8,
]


def send_values(values: Tuple[torch.Tensor, ...], dst: int) -> None:
    """Evaluation's point-to-point hand-over: how many tensors, then each one's shape, dtype and data."""
    device = values[0].device
    dist.send(torch.tensor([len(values)], dtype=torch.long, device=device), dst)
    for tensor in values:
        header = torch.zeros(10, dtype=torch.long)
        header[0], header[1] = tensor.dim(), _DTYPES.index(tensor.dtype)
        header[2 : 2 + tensor.dim()] = torch.tensor(tensor.shape)
        dist.send(header.to(device), dst)
        dist.send(tensor.contiguous(), dst)


def recv_values(src: int, device: torch.device) -> Tuple[torch.Tensor, ...]:
    count = torch.zeros(1, dtype=torch.long, device=device)
    dist.recv(count, src)
    values = []
    for _ in range(int(count.item())):
        header = torch.zeros(10, dtype=torch.long, device=device)
        dist.recv(header, src)
        out = torch.empty(header[2 : 2 + int(header[0])].tolist(), dtype=_DTYPES[int(header[1])], device=device)
        dist.recv(out, src)
        values.append(out)
    return tuple(values)


@dataclass(frozen=True)
class PipeliningSettings(PipelineSettings):
    """The pipeline's keys (engine=pipelining) and the schedule of its micro-batches."""

    schedule: str


class PipeliningStrategy(Strategy):
    name = "pipelining"
    settings_type = PipeliningSettings
    settings: PipeliningSettings
    needs_example = True  # each stage infers the shape of the activations it receives
    supports_compile = False  # the schedule calls the stage module directly

    def __init__(self, setup: StrategySetup) -> None:
        super().__init__(setup)
        ranks = setup.ranks
        self.num_stages = int(self.settings.stages)  # resolved on the launch side (len(split_points) + 1 when given)
        if ranks.world_size % self.num_stages:
            raise ValueError(f"world size {ranks.world_size} is not a multiple of strategy.stages={self.num_stages}")
        self.stage_index = ranks.rank % self.num_stages
        self.replica = ranks.rank // self.num_stages
        self.replicas = ranks.world_size // self.num_stages
        self.split = split_settings(self.settings.node)
        self.chunks = self.split.chunks
        self.mesh = self.device_mesh()
        self.pp_group = self.mesh.get_group("stage")  # this replica's pipeline: its S consecutive ranks
        self.dp_group = self.mesh.get_group("replica")  # this stage's D copies: ranks stage_index, +S, +2S, ...
        self.schedule = None

    def device_mesh(self):
        """The D x S mesh ("replica", "stage") over the ranks in order: rank r sits at (r // S, r % S), as
        stage_index and replica say. Every rank builds it (its groups are created collectively)."""
        return init_device_mesh(
            self.input_device.type, (self.replicas, self.num_stages), mesh_dim_names=("replica", "stage")
        )

    @property
    def is_first(self) -> bool:
        return self.stage_index == 0

    @property
    def is_last(self) -> bool:
        return self.stage_index == self.num_stages - 1

    @property
    def data_parallel_size(self) -> int:
        return self.replicas

    @property
    def data_parallel_rank(self) -> int:
        return self.replica

    def wrap(self, model: nn.Module, example: Optional[torch.Tensor] = None) -> nn.Module:
        micro = micro_batch(example, self.chunks)
        stages = split_model(model, self.num_stages, self.split.balance, self.split.split_points, micro)
        # What this stage receives for one micro-batch, with the dtype autocast gives it (shape/dtype metadata).
        with autocast(self.precision, torch.device("cpu")):
            inputs = stage_inputs(stages, self.stage_index, micro)
        module = stages[self.stage_index].to(self.input_device)
        self.stage = PipelineStage(
            module,
            self.stage_index,
            self.num_stages,
            self.input_device,
            input_args=tuple(v.to(self.input_device) for v in inputs),
            group=self.pp_group,
        )
        schedule_cls = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}[self.split.schedule]
        kwargs = {}
        loss_fn = self._loss
        if "scale_grads" in inspect.signature(schedule_cls.__init__).parameters:
            kwargs["scale_grads"] = True
        else:  # older torch sums micro-batch gradients: average them through the loss instead
            loss_fn = lambda out, target: self._loss(out, target) / self.chunks  # noqa: E731
        self.schedule = schedule_cls(self.stage, self.chunks, loss_fn=loss_fn, **kwargs)
        return module

    def _loss(self, outputs: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return self.loss_fn(outputs.float(), target)

    def forward_backward(self, model, batch, scaler):
        images, labels = batch
        losses = schedule_step(
            self.schedule, images, labels, self.is_first, self.is_last, self.precision, self.input_device
        )
        if self.replicas > 1:  # average this stage's gradients over its replicas (what DDP would do)
            for param in model.parameters():
                if param.grad is not None:
                    dist.all_reduce(param.grad, op=dist.ReduceOp.SUM, group=self.dp_group)
                    param.grad /= self.replicas
        if losses:
            return torch.stack([loss.detach().float() for loss in losses]).mean(), {}
        return torch.zeros((), device=self.input_device), {}

    def global_norm(self, local_norm: torch.Tensor) -> torch.Tensor:
        """Each stage holds its own parameters: the model's norm is the root of the stages' summed squares
        (over this replica's pipeline; the replicas' averaged gradients are equal)."""
        squared = (local_norm.float() ** 2).reshape(1).to(distributed.collective_device(self.input_device))
        dist.all_reduce(squared, op=dist.ReduceOp.SUM, group=self.pp_group)
        return squared.sqrt().reshape(()).to(local_norm.device)

    def global_loss(self, loss: torch.Tensor) -> float:
        # Only last stages hold a loss; the others contribute 0 to the sum over the world.
        total = distributed.all_reduce_sum(loss.float().reshape(1).to(distributed.collective_device(self.input_device)))
        return total.item() / self.replicas

    def eval_counts(self, model, batch) -> torch.Tensor:
        """Forward through the stages with plain point-to-point messages; the last stage counts."""
        images, labels = batch
        inputs = (images,) if self.is_first else recv_values(self.ranks.rank - 1, self.input_device)
        with autocast(self.precision, self.input_device):
            out = model(*inputs)
        if not self.is_last:
            send_values(out if isinstance(out, tuple) else (out,), self.ranks.rank + 1)
            return torch.zeros(4, dtype=torch.float64)
        return super().eval_counts(lambda _: out, (images, labels))

    def predict(self, model, images):
        return model(images)

    @property
    def checkpoint_key(self) -> str:
        return f"stage{self.stage_index}"

    @property
    def owns_checkpoint_shard(self) -> bool:
        return self.replica == 0

    def weights_file(self) -> Optional[str]:
        return rundir.stage_weights(self.stage_index) if self.replica == 0 else None
