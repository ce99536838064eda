"""`fsdp`: fully sharded data parallel with FSDP2 (``torch.distributed.fsdp.fully_shard``).

Laid out like ddp (one rank per device, the global batch split over all W ranks), but each
rank holds 1/W of every parameter, gradient and optimizer state: a block's parameters are
all-gathered just before it runs and its gradients reduce-scattered after its backward pass.
The units sharded one by one are the blocks of the model's repeated block list (a
transformer's layers; hpc_train.compute.parallel.partitioning.find_block_list), else `strategy.wrap`'s
modules, else every direct child holding parameters; the root takes what is left.

HSDP (`strategy.replicate=nodes`, or R replicas): a 2-D device mesh ("replicate", "shard"):
parameters are sharded inside a node, where links are fast, and replicated across nodes,
whose gradients are all-reduced. Checkpoints are torch.distributed.checkpoint directories that
any other number of ranks can load (hpc_train.compute.checkpointing.sharded).
"""

from __future__ import annotations

import contextlib
import difflib
import logging
from dataclasses import dataclass
from typing import Any, Dict, Iterator, List, Optional, Union

import torch
import torch.nn as nn
from torch.distributed.device_mesh import init_device_mesh

from hpc_train.compute.parallel.base import Strategy, StrategySettings
from hpc_train.compute.parallel.ddp import ReplicatedAcrossRanks
from hpc_train.compute.parallel.partitioning import find_block_list
from hpc_train.compute.parallel.precision import DTYPES
from hpc_train.compute.runtime.refusal import Refusal
from hpc_train.strategy_table import fsdp_mesh

log = logging.getLogger("hpc_train")


def shard_units(model: nn.Module, names: Optional[List[str]] = None) -> List[nn.Module]:
    """The modules sharded one by one (each all-gathered on its own): named ones, else the blocks of the
    model's repeated block list, else every direct child that holds parameters."""
    if names:
        known = dict(model.named_modules())
        for name in names:
            if name not in known or not name:
                close = difflib.get_close_matches(name, [k for k in known if k], n=1)
                raise Refusal(
                    f"`strategy.wrap`: the model has no module {name!r}{f' (did you mean {close[0]!r}?)' if close else ''}."
                    " Fix: name modules of model.named_modules(), e.g. strategy.wrap=[encoder,decoder], or"
                    " strategy.wrap=null (each block of the model's block list)."
                )
        return [known[name] for name in names]
    try:
        return list(find_block_list(model).blocks)
    except Refusal:
        return [child for child in model.children() if any(True for _ in child.parameters())]


def mixed_precision_policy(precision: str) -> Optional[Any]:
    """bf16/fp16 parameters for compute, gradients reduced in fp32 (FSDP2's MixedPrecisionPolicy)."""
    if precision not in DTYPES:
        return None
    from torch.distributed.fsdp import MixedPrecisionPolicy  # ~0.6 s to import: only fsdp runs pay it

    return MixedPrecisionPolicy(param_dtype=DTYPES[precision], reduce_dtype=torch.float32)


@dataclass(frozen=True)
class FSDPSettings(StrategySettings):
    replicate: Union[int, str]  # R replicas, or nodes (HSDP)
    reshard_after_forward: bool
    cpu_offload: bool
    wrap: Optional[List[str]]  # the modules sharded one by one (None: found, see shard_units)


class FSDPStrategy(ReplicatedAcrossRanks, Strategy):
    name = "fsdp"
    settings_type = FSDPSettings
    settings: FSDPSettings
    supports_compile = False  # blocks are compiled one by one before sharding (trainer.compile), as torchtitan does
    sharded_checkpoints = True  # torch.distributed.checkpoint directories, resumable at another world size

    @property
    def mesh_shape(self) -> tuple:
        tasks = self.ranks.local_world_size or self.ranks.world_size
        replicas, shards = fsdp_mesh(self.settings.node, max(1, self.ranks.world_size // tasks), tasks)
        if replicas * shards != self.ranks.world_size:  # a local run has one "node"
            replicas, shards = 1, self.ranks.world_size
        return replicas, shards

    def device_mesh(self):
        replicas, shards = self.mesh_shape
        device_type = self.input_device.type
        if replicas == 1:
            return init_device_mesh(device_type, (shards,), mesh_dim_names=("shard",))
        return init_device_mesh(device_type, (replicas, shards), mesh_dim_names=("replicate", "shard"))

    def wrap(self, model: nn.Module, example=None) -> nn.Module:
        model = model.to(self.input_device)
        if not self.ranks.is_distributed:
            return model
        from torch.distributed.fsdp import CPUOffloadPolicy, fully_shard  # ~0.6 s: only fsdp runs pay it

        options: Dict[str, Any] = {
            "mesh": self.device_mesh(),
            "reshard_after_forward": bool(self.settings.reshard_after_forward),
        }
        policy = mixed_precision_policy(self.precision)
        if policy is not None:
            options["mp_policy"] = policy
        if self.settings.cpu_offload and self.input_device.type != "cpu":
            options["offload_policy"] = CPUOffloadPolicy()
        elif self.settings.cpu_offload:  # CPU workers: the sharded state is in CPU memory already
            log.info("strategy.cpu_offload: the ranks compute on the CPU, where the sharded state already lives")
        wrap = self.settings.wrap
        units = shard_units(model, None if wrap is None else [str(n) for n in wrap])
        if self.compile_blocks:
            self._compile(units)
        for unit in units:
            fully_shard(unit, **options)
        fully_shard(model, **options)
        replicas, shards = self.mesh_shape
        log.info(
            "fsdp: %d units sharded over %d ranks%s, reshard_after_forward=%s%s%s",
            len(units),
            shards,
            f" x {replicas} replicas (HSDP)" if replicas > 1 else "",
            options["reshard_after_forward"],
            f", {self.precision} parameters, fp32 reductions" if policy is not None else "",
            ", CPU offload" if "offload_policy" in options else "",
        )
        return model

    @staticmethod
    def _compile(units: List[nn.Module]) -> None:
        """torch.compile each unit in place before it is sharded (its parameter names stay the same)."""
        try:
            for unit in units:
                unit.compile()
        except Exception as err:  # an nn.Module without .compile (torch < 2.2) or a backend that is missing
            log.warning("trainer.compile is ignored for fsdp: compiling its blocks failed on this torch (%s)", err)

    def unwrap(self, model: nn.Module) -> nn.Module:
        return model

    @contextlib.contextmanager
    def no_sync(self, model: nn.Module) -> Iterator[None]:
        """FSDP2 skips the reduce-scatter of gradients inside the block (they accumulate unsharded)."""
        model = getattr(model, "_orig_mod", model)
        sync = getattr(model, "set_requires_gradient_sync", None)
        if sync is None:  # not sharded (one process)
            yield
            return
        sync(False)
        try:
            yield
        finally:
            sync(True)

    def global_norm(self, local_norm: torch.Tensor) -> torch.Tensor:
        """The norm over sharded DTensor gradients is a DTensor with pending partial sums: made whole."""
        return local_norm.full_tensor() if hasattr(local_norm, "full_tensor") else local_norm

    def make_grad_scaler(self) -> Optional[Any]:
        """fp16 loss scaling over sharded gradients: torch's ShardedGradScaler agrees on inf/NaN across ranks."""
        if self.precision != "16":
            return None
        from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler  # fsdp's, only with fp16

        return ShardedGradScaler(self.input_device.type)

    def final_state_dict(self, model: nn.Module) -> Dict[str, torch.Tensor]:
        """The whole model's state gathered on rank 0 (empty elsewhere): a collective."""
        if not self.ranks.is_distributed:
            return model.state_dict()
        # torch.distributed.checkpoint costs ~1 s to import: only at export
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))

    @property
    def owns_checkpoint_shard(self) -> bool:
        return True  # every rank writes its own shard
