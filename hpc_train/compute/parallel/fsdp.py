"""`fsdp`: fully sharded data parallel with FSDP2, as a preset of the mesh engine (``mesh`` with only
data-parallel dimensions: ``dp_replicate`` R x ``dp_shard`` W / R).

Laid out like ddp (one rank per device, the global batch split over all W ranks), but each
rank holds 1/W of every parameter, gradient and optimizer state (hpc_train.compute.parallel.sharding).
HSDP (`strategy.replicate=nodes`, or R replicas): parameters are sharded inside a node, where links
are fast, and replicated across nodes, whose gradients are all-reduced. What fsdp adds to the mesh
engine: its own keys (the replicas, ``reshard_after_forward``, CPU offload, the units to shard) and
fp16 loss scaling over sharded gradients. Checkpoints are torch.distributed.checkpoint directories
that any other number of ranks, or a ``mesh`` job, can load (hpc_train.compute.checkpointing.sharded).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Union

import torch.nn as nn

from hpc_train.compute.parallel.base import StrategySettings, StrategySetup
from hpc_train.compute.parallel.mesh import MeshStrategy
from hpc_train.compute.parallel.sharding import shard_units
from hpc_train.contracts.mesh_dims import MeshDims
from hpc_train.contracts.strategy_table import fsdp_mesh

log = logging.getLogger("hpc_train")


@dataclass(frozen=True)
class FSDPSettings(StrategySettings):
    replicate: Union[int, str]  # R replicas, or nodes (HSDP)
    reshard_after_forward: bool
    cpu_offload: bool
    wrap: Optional[List[str]]  # the modules sharded one by one (None: found, see shard_units)


class FSDPStrategy(MeshStrategy):
    name = "fsdp"
    settings_type = FSDPSettings
    settings: FSDPSettings
    needs_torch = None  # runs on every torch the project supports

    def mesh_dims(self, setup: StrategySetup) -> MeshDims:
        """(1, R, W / R, 1) from strategy.replicate; a local run has one "node"."""
        ranks = setup.ranks
        tasks = ranks.local_world_size or ranks.world_size
        replicas, shards = fsdp_mesh(self.settings.node, max(1, ranks.world_size // tasks), tasks)
        if replicas * shards != ranks.world_size:
            replicas, shards = 1, ranks.world_size
        return MeshDims(pp=1, dp_replicate=replicas, dp_shard=shards, tp=1)

    def shard_units(self, model: nn.Module) -> List[nn.Module]:
        wrap = self.settings.wrap
        return shard_units(model, None if wrap is None else [str(n) for n in wrap])

    def shard_options(self) -> Dict[str, Any]:
        options = super().shard_options()
        options["reshard_after_forward"] = bool(self.settings.reshard_after_forward)
        if self.settings.cpu_offload and self.input_device.type != "cpu":
            from torch.distributed.fsdp import CPUOffloadPolicy  # ~0.6 s: only fsdp runs pay it

            options["offload_policy"] = CPUOffloadPolicy()
        elif self.settings.cpu_offload:  # CPU workers: the sharded state is in CPU memory already
            log.info("strategy.cpu_offload: the ranks compute on the CPU, where the sharded state already lives")
        return options

    def describe_sharding(self, units: int, options: Dict[str, Any]) -> None:
        log.info(
            "fsdp: %d units sharded over %d ranks%s, reshard_after_forward=%s%s%s%s",
            units,
            self.dims.dp_shard,
            f" x {self.dims.dp_replicate} replicas (HSDP)" if self.dims.dp_replicate > 1 else "",
            options["reshard_after_forward"],
            f", {self.precision} parameters, fp32 reductions" if "mp_policy" in options else "",
            ", CPU offload" if "offload_policy" in options else "",
            ", each unit's forward compiled" if self.compiled_blocks else "",
        )
