"""`mesh`: pipeline stages, data replicas, FSDP2 shards and tensor parallel composed on one DeviceMesh.

The dimensions come resolved from the launch side (hpc_train.contracts.mesh_dims: ``pp x dp_replicate x dp_shard x
tp``, pp outermost, tp innermost) and are built here as one ``init_device_mesh`` whose named slices
each part uses. The model is composed as torchtitan composes it:

1. pp > 1: the model is cut into ``pp`` stages (the pipelining engine's cut: split points, else
   between the blocks of its block list); this rank keeps its stage, whose modules keep the whole
   model's names, so a checkpoint reshards across any change of pp;
2. tensor parallel: the user's plan (hpc_train.compute.parallel.tensor_parallel) on the ``tp`` slice;
3. FSDP2 over the data-parallel slice (``dp_shard``; HSDP's 2-D ``dp_replicate x dp_shard`` when
   there are replicas): each block of the model's block list, then the root; a stage is one unit
   (a traced stage calls the model's leaf modules, not its blocks) and keeps its gathered
   parameters between micro-batches (``reshard_after_forward`` off, as torchtitan does under pp);
4. pp > 1: a ``PipelineStage`` on the ``pp`` slice and the GPipe or 1F1B schedule, the loss
   divided by the micro-batches and ``scale_grads`` off (torchtitan's way, which composes with FSDP).

The data is sharded by the data-parallel coordinate only: a tp group and the stages of one pipeline
read the same batch. The gradient norm is the one norm of the whole model: each mesh's DTensor
gradients are normed and made whole, their squares summed, then summed over the stages.
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass
from typing import Any, Dict, Iterator, List, Mapping, Optional, Tuple, Union

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import init_device_mesh

from hpc_train.compute.parallel import sharding
from hpc_train.compute.parallel.base import Strategy, StrategySettings, StrategySetup
from hpc_train.compute.parallel.gradients import total_norm
from hpc_train.compute.parallel.partitioning import micro_batch
from hpc_train.compute.parallel.precision import autocast
from hpc_train.compute.parallel.schedule_step import schedule_step
from hpc_train.compute.parallel.staged_model import split_model
from hpc_train.compute.parallel.tensor_parallel import apply_plan, check_plan
from hpc_train.compute.parallel.tracing import stage_inputs
from hpc_train.compute.runtime import distributed
from hpc_train.compute.runtime.refusal import Refusal
from hpc_train.contracts.mesh_dims import KEYS, ORDER, TORCH_NEEDED, MeshDims, torch_refusal, torch_too_old
from hpc_train.records import rundir

log = logging.getLogger("hpc_train")


@dataclass(frozen=True)
class MeshSettings(StrategySettings):
    dp_replicate: int
    dp_shard: int  # -1 in the spec: the resolved degree is the layout's (StrategySetup.layout.mesh)
    tp: int
    pp: int
    tp_plan: Optional[Mapping[str, Any]]
    split_points: Optional[List[str]]
    chunks: int
    balance: Union[str, List[int]]
    schedule: str


class MeshStrategy(Strategy):
    name = "mesh"
    settings_type = MeshSettings
    settings: MeshSettings
    supports_compile = False  # blocks are compiled one by one before sharding (trainer.compile), as fsdp does
    sharded_checkpoints = True  # DCP directories with the whole model's names: any change of the dimensions
    needs_torch: Optional[Tuple[int, int]] = TORCH_NEEDED  # the oldest torch it runs on (None: any supported one)

    def __init__(self, setup: StrategySetup) -> None:
        super().__init__(setup)
        if self.needs_torch is not None and torch_too_old(torch.__version__):
            raise Refusal(str(torch_refusal(torch.__version__)))
        self.dims = self.mesh_dims(setup)
        if self.dims.world_size != self.ranks.world_size:
            raise Refusal(
                f"`strategy`: this job was laid out for {self.dims.describe()} = {self.dims.world_size} ranks but"
                f" started {self.ranks.world_size}. Fix: start it through hpc-train (which starts one rank per GPU"
                " of the layout), or give the same numbers to torchrun / srun."
            )
        self.at = self.dims.coordinates(self.ranks.rank)
        self.world_mesh = (
            init_device_mesh(self.input_device.type, self.dims.shape, mesh_dim_names=ORDER)
            if self.ranks.is_distributed
            else None
        )
        self.schedule = None

    # -- the mesh ---------------------------------------------------------------------
    def mesh_dims(self, setup: StrategySetup) -> MeshDims:
        """The dimensions the launch side resolved (hpc_train.contracts.mesh_dims); a preset may derive them from its
        keys."""
        return MeshDims(*setup.layout.mesh)

    def _slice(self, *names: str) -> Any:
        return self.world_mesh[names[0] if len(names) == 1 else names]

    @property
    def pipelined(self) -> bool:
        return self.dims.pp > 1

    @property
    def needs_example(self) -> bool:  # type: ignore[override]
        return self.pipelined  # each stage infers the shape of what it receives

    @property
    def is_first(self) -> bool:
        return self.at["pp"] == 0

    @property
    def is_last(self) -> bool:
        return self.at["pp"] == self.dims.pp - 1

    @property
    def data_parallel_size(self) -> int:
        return self.dims.data_parallel_size

    @property
    def data_parallel_rank(self) -> int:
        return self.dims.data_shard(self.ranks.rank)[0]

    @property
    def holds_the_loss(self) -> bool:
        """One rank per data-parallel coordinate counts its batch: the last stage's first tp rank."""
        return self.is_last and self.at["tp"] == 0

    # -- composition ------------------------------------------------------------------
    def wrap(self, model: nn.Module, example: Optional[torch.Tensor] = None) -> nn.Module:
        plan = {str(k): v for k, v in self.settings.tp_plan.items()} if self.dims.tp > 1 else None
        if plan:
            check_plan(model, plan, self.dims.tp)  # the whole model: a stage holds only some of the matches
        stage_values: Tuple[Tuple[torch.Tensor, ...], Tuple[torch.Tensor, ...]] = ((), ())
        if self.pipelined:
            model, stage_values = self._cut(model, example)
        model = model.to(self.input_device)
        if plan:
            cut = apply_plan(model, plan, self._slice("tp"))
            log.info("tensor parallel over %d ranks: %d modules cut (%s)", self.dims.tp, len(cut), _few(cut))
        self._shard(model)
        if self.pipelined:
            self._build_schedule(model, *stage_values)
        log.info("mesh: %s (this rank at %s)", self.dims.describe(), _coordinates(self.at))
        return model

    def _cut(
        self, model: nn.Module, example: Optional[torch.Tensor]
    ) -> Tuple[nn.Module, Tuple[Tuple[torch.Tensor, ...], Tuple[torch.Tensor, ...]]]:
        """This rank's stage of the model, and what it receives and sends for one micro-batch (shapes and dtypes:
        given both, the stage needs no shape inference between ranks, which a fake process group cannot run)."""
        micro = micro_batch(example, int(self.settings.chunks))
        points = [str(p) for p in self.settings.split_points] if self.settings.split_points is not None else None
        stages = split_model(
            model, self.dims.pp, self.settings.balance, points, micro, named=True, stages_key=KEYS["pp"]
        )
        stage = stages[self.at["pp"]]
        with autocast(self.precision, torch.device("cpu")):
            inputs = stage_inputs(stages, self.at["pp"], micro)
            if not self.is_first:  # activations from the stage before: their gradients go back to it
                inputs = tuple(v.requires_grad_(v.is_floating_point()) for v in inputs)
            outputs = stage(*inputs)  # with autograd on: whether an output takes a gradient is part of what it sends
        sent = outputs if isinstance(outputs, tuple) else (outputs,)
        return stage, (inputs, tuple(v.detach().requires_grad_(v.requires_grad) for v in sent))

    def _shard(self, model: nn.Module) -> None:
        """trainer.compile's blocks, then FSDP2 over the data-parallel slice: HSDP's 2-D mesh with replicas, else the
        shards' 1-D one."""
        units = self.shard_units(model)
        if self.compile_blocks and units:
            self.compiled_blocks = sharding.compile_units(units)
        if self.dims.data_parallel_size == 1:
            return
        options = self.shard_options()
        sharding.shard(model, units, options)
        self.describe_sharding(len(units), options)

    def shard_units(self, model: nn.Module) -> List[nn.Module]:
        """The modules sharded one by one: a stage is one unit (a traced stage calls the model's leaf modules, not
        its blocks); a whole model's are its blocks (hpc_train.compute.parallel.sharding.shard_units)."""
        return [] if self.pipelined else sharding.shard_units(model)

    def shard_options(self) -> Dict[str, Any]:
        """fully_shard's keyword arguments: the data-parallel mesh, the precision, and gathered parameters kept
        between a stage's micro-batches (one all-gather per step instead of one per micro-batch)."""
        dp_mesh = self._slice("dp_replicate", "dp_shard") if self.dims.dp_replicate > 1 else self._slice("dp_shard")
        options: Dict[str, Any] = {"mesh": dp_mesh, "reshard_after_forward": not self.pipelined}
        policy = sharding.mixed_precision_policy(self.precision)
        if policy is not None:
            options["mp_policy"] = policy
        return options

    def describe_sharding(self, units: int, options: Dict[str, Any]) -> None:
        """A line for the rank's log (the mesh line says it all for mesh)."""

    def _build_schedule(
        self, stage_module: nn.Module, inputs: Tuple[torch.Tensor, ...], outputs: Tuple[torch.Tensor, ...]
    ) -> None:
        # torch.distributed.pipelining costs ~1.4 s to import: only pipelined meshes pay it
        from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

        self.stage = PipelineStage(
            stage_module,
            self.at["pp"],
            self.dims.pp,
            self.input_device,
            input_args=tuple(v.to(self.input_device) for v in inputs),
            output_args=tuple(v.to(self.input_device) for v in outputs),
            group=self._slice("pp").get_group(),
        )
        chunks = int(self.settings.chunks)
        schedule_cls = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}[str(self.settings.schedule).lower()]
        self.schedule = schedule_cls(
            self.stage,
            chunks,
            loss_fn=lambda out, target: self.loss_fn(out.float(), target) / chunks,
            scale_grads=False,
        )

    # -- compute ----------------------------------------------------------------------
    def forward_backward(self, model, batch, scaler, loss_weight: float = 1.0):
        if not self.pipelined:
            return super().forward_backward(model, batch, scaler, loss_weight)
        inputs, labels = batch
        losses = schedule_step(
            self.schedule, inputs, labels, self.is_first, self.is_last, self.precision, self.input_device
        )
        if losses:  # each a micro-batch's loss divided by their number: their sum is the batch's mean
            return torch.stack([loss.detach().float() for loss in losses]).sum(), {}
        return torch.zeros((), device=self.input_device), {}

    @contextlib.contextmanager
    def no_sync(self, model: nn.Module) -> Iterator[None]:
        """FSDP2 skips the gradient reduce-scatter inside the block (they accumulate unsharded)."""
        sync = getattr(getattr(model, "_orig_mod", model), "set_requires_gradient_sync", None)
        if sync is None:
            yield
            return
        sync(False)
        try:
            yield
        finally:
            sync(True)

    def grad_norm(self, model: nn.Module, max_norm: Optional[float] = None) -> torch.Tensor:
        """The one norm over tp shards, FSDP shards and stages; gradients scaled to at most `max_norm`."""
        grads = [p.grad for p in model.parameters() if p.grad is not None]
        squared = torch.zeros((), dtype=torch.float32)
        for group in _by_mesh(grads):
            norm = total_norm(group, self.input_device)
            norm = norm.full_tensor() if hasattr(norm, "full_tensor") else norm
            squared = squared + norm.detach().float().cpu() ** 2
        if self.pipelined:
            device = distributed.collective_device(self.input_device)
            squared = squared.reshape(1).to(device)
            dist.all_reduce(squared, op=dist.ReduceOp.SUM, group=self._slice("pp").get_group())
            squared = squared.cpu().reshape(())
        norm = squared.sqrt()
        if max_norm is not None:
            coefficient = torch.clamp(float(max_norm) / (norm + 1e-6), max=1.0).item()
            for grad in grads:
                grad.mul_(coefficient)
        return norm

    def make_grad_scaler(self) -> Optional[Any]:
        """fp16 loss scaling over sharded gradients: torch's ShardedGradScaler agrees on inf/NaN across ranks."""
        if self.precision != "16" or self.dims.data_parallel_size == 1:
            return super().make_grad_scaler()
        from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler  # fsdp's, only with fp16

        return ShardedGradScaler(self.input_device.type)

    def global_loss(self, loss: torch.Tensor) -> float:
        """The mean over the data-parallel ranks of the loss the last stages computed (tp ranks hold copies)."""
        if not self.ranks.is_distributed:
            return float(loss)
        device = distributed.collective_device(self.input_device)
        held = torch.tensor([float(loss), 1.0], dtype=torch.float64) * float(self.holds_the_loss)
        total = distributed.all_reduce_sum(held.to(device)).cpu()
        return float(total[0] / total[1])

    def global_metrics(self, metrics: Dict[str, torch.Tensor]) -> Dict[str, float]:
        """Averaged like the loss: over the ranks that hold one (a tp group's copies counted once)."""
        if not self.metric_names or not self.ranks.is_distributed:
            return super().global_metrics(metrics)
        device = distributed.collective_device(self.input_device)
        values = [float(metrics[name]) * float(self.holds_the_loss) for name in self.metric_names]
        total = distributed.all_reduce_sum(
            torch.tensor([*values, float(self.holds_the_loss)], dtype=torch.float64).to(device)
        ).cpu()
        return {name: float(total[i] / total[-1]) for i, name in enumerate(self.metric_names)}

    def eval_counts(self, model: nn.Module, batch: Any) -> torch.Tensor:
        """This rank's sums over an evaluation batch; only the rank holding the loss counts (the others ran their
        part: tensor-parallel collectives, or the stages' forward, handing activations on)."""
        if self.pipelined:
            return self._staged_eval_counts(model, batch)
        counts = super().eval_counts(model, batch)
        return counts if self.holds_the_loss else torch.zeros_like(counts)

    def _staged_eval_counts(self, model: nn.Module, batch: Any) -> torch.Tensor:
        # the pipelining engine's module imports torch.distributed.pipelining (~1.4 s): only pipelined meshes pay it
        from hpc_train.compute.parallel.pipelining import recv_values, send_values

        inputs, labels = batch
        group = self._slice("pp").get_group()
        peers = dist.get_process_group_ranks(group)  # this pipeline's ranks, stage by stage
        stage = self.at["pp"]
        values = (inputs,) if self.is_first else recv_values(peers[stage - 1], self.input_device)
        with autocast(self.precision, self.input_device):
            out = model(*values)
        if not self.is_last:
            send_values(out if isinstance(out, tuple) else (out,), peers[stage + 1])
            return torch.zeros(4 + len(self.metric_names), dtype=torch.float64)
        counts = Strategy.eval_counts(self, lambda _: out, (inputs, labels))
        return counts if self.holds_the_loss else torch.zeros_like(counts)

    def predict(self, model: nn.Module, images: torch.Tensor) -> torch.Tensor:
        return model(images) if self.pipelined else super().predict(model, images)

    # -- weights and checkpoints ------------------------------------------------------
    def final_state_dict(self, model: nn.Module) -> Dict[str, torch.Tensor]:
        """The whole model's weights on rank 0 under the model's own names (empty elsewhere): a collective."""
        if not self.ranks.is_distributed:
            return model.state_dict()
        # torch.distributed.checkpoint costs ~1 s to import: only at export
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        if not self.pipelined:
            return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        stage = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))
        leader = self.at["dp_replicate"] == self.at["dp_shard"] == self.at["tp"] == 0
        mine = {name: value.detach().cpu() for name, value in stage.items()} if leader else {}
        parts = distributed.gather_to_main(mine)
        whole: Dict[str, torch.Tensor] = {}
        for part in parts or []:
            whole.update(part)  # each stage's names are the model's own: no two stages share one
        return whole

    def weights_file(self) -> Optional[str]:
        return rundir.WEIGHTS if self.ranks.is_main else None

    @property
    def owns_checkpoint_shard(self) -> bool:
        return True  # every rank writes its own shards (DCP drops the copies replicas hold)


def _by_mesh(grads: List[torch.Tensor]) -> List[List[torch.Tensor]]:
    """The gradients grouped by the device mesh they are DTensors on (plain tensors in one group): torch stacks the
    per-tensor norms, which needs one mesh per call."""
    groups: List[Tuple[Any, List[torch.Tensor]]] = []
    for grad in grads:
        mesh = getattr(grad, "device_mesh", None)
        for known, members in groups:
            if known == mesh:
                members.append(grad)
                break
        else:
            groups.append((mesh, [grad]))
    return [members for _, members in groups]


def _few(names: List[str], shown: int = 3) -> str:
    return ", ".join(names[:shown]) + (f", ... ({len(names)} in all)" if len(names) > shown else "")


def _coordinates(at: Mapping[str, int]) -> str:
    return " ".join(f"{dim}={value}" for dim, value in at.items())
