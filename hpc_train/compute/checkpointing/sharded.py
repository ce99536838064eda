"""The checkpointer of sharded strategies (fsdp): torch.distributed.checkpoint directories, resumable at any world.

Same contract as :class:`hpc_train.compute.checkpointing.checkpointer.Checkpointer` (the trainer cannot tell them
apart), but the model and optimizer state never meet in one process: each rank saves its own
shards of ``get_state_dict(model, optimizer)`` into ``checkpoints/step_<N>/`` and loads what
its (possibly different) shards need, so a run checkpointed at W ranks resumes at W' ranks
(DCP reshards). Rank 0 adds the loop state (schedule, position, GradScaler, every rank's RNG
and stream position, fingerprint) as ``loop.pt``; the directory is
hpc_train.compute.checkpointing.dcp_save's, its safety rules dcp_load's.

Resuming at another world size: parameters, optimizer state and the position in the data
(the global batch is fixed, so the sampler's next block of samples is the same) carry over
exactly; per-rank RNG streams are restored for the ranks that existed before (others keep
their fresh seeds), and a stream's per-rank read position gives way to re-reading and
skipping (hpc_train.compute.training.trainer).
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any, Callable, Dict, Mapping, Optional, Tuple

import torch
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict
from torch.distributed.checkpoint.stateful import Stateful

from hpc_train.compute.checkpointing.checkpointer import Checkpointer
from hpc_train.compute.checkpointing.dcp_dirs import step_dir
from hpc_train.compute.checkpointing.dcp_load import load_dcp, read_loop
from hpc_train.compute.checkpointing.dcp_manifest import MANIFEST_FORMAT
from hpc_train.compute.checkpointing.dcp_save import save_dcp
from hpc_train.compute.checkpointing.files import CheckpointError, UnsafeCheckpoint
from hpc_train.compute.runtime import distributed
from hpc_train.compute.runtime.distributed import SideGroup
from hpc_train.records import rundir

log = logging.getLogger("hpc_train")


# The optimizer's state keyed by parameter name (``state.<name>.exp_avg``), not by its index in a param group: a
# pipeline stage's indices would collide with another stage's, and names survive any change of the sharding.
FLAT = StateDictOptions(flatten_optimizer_state_dict=True)


class ShardedState(Stateful):
    """Each rank's own shards, as DCP saves them: the model's and the optimizer's (``get_state_dict``: any
    sharding, any world size) and, with ``trainer.ema_decay``, the weight average's (sharded like the parameters).

    ``state_dict()`` is ``{"model": ..., "optim": ...}`` (plus ``"ema"``), the checkpoint's ``model.*``,
    ``optim.*`` and ``ema.*`` entries; at a load it is also the template DCP fills in place, which
    ``load_state_dict`` then puts back into the model, optimizer and average.
    """

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, ema: Optional[Stateful]) -> None:
        self.model, self.optimizer, self.ema = model, optimizer, ema

    def state_dict(self) -> Dict[str, Any]:
        model_state, optim_state = get_state_dict(self.model, self.optimizer, options=FLAT)
        state = {"model": model_state, "optim": optim_state}
        if self.ema is not None:
            state["ema"] = self.ema.state_dict()
        return state

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        set_state_dict(
            self.model,
            self.optimizer,
            model_state_dict=state_dict["model"],
            optim_state_dict=state_dict["optim"],
            options=FLAT,
        )
        if self.ema is not None:
            self.ema.load_state_dict(state_dict["ema"])  # loaded in place; checks every name is there


class LoopState(Stateful):
    """The holders equal on every rank, as rank 0 saves them in ``loop.pt``: each shared one (LR schedule, loop
    position) under its name, and the GradScaler under ``"scaler"`` (None without one)."""

    def __init__(self, shared: Mapping[str, Stateful], scaler: Optional[Stateful]) -> None:
        self.shared, self.scaler = dict(shared), scaler

    def state_dict(self) -> Dict[str, Any]:
        return {
            **{name: holder.state_dict() for name, holder in self.shared.items()},
            "scaler": self.scaler.state_dict() if self.scaler is not None else None,
        }

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        if self.scaler is not None and state_dict.get("scaler"):
            self.scaler.load_state_dict(state_dict["scaler"])
        for name, holder in self.shared.items():
            holder.load_state_dict(state_dict[name])


class ShardedCheckpointer(Checkpointer):
    """Checkpointer whose model and optimizer are saved by every rank, as torch.distributed.checkpoint shards."""

    may_change = (
        " (a sharded checkpoint lets only the layout change: resources.nodes, resources.gpus_per_node, fsdp's"
        " strategy.replicate, mesh's dimensions, or fsdp <-> mesh)"
    )

    def _shards(self) -> ShardedState:
        return ShardedState(self.sharded["model"], self.sharded["optimizer"], self.sharded.get("ema"))

    def _loop_state(self) -> LoopState:
        return LoopState(self.shared, self.sharded.get("scaler"))

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # A background save's collectives (DCP's planning, the manifest's gathering, the install) run on a group of
        # their own: the main thread goes on using its groups meanwhile.
        self.side = SideGroup() if self.background else None

    # -- saving -------------------------------------------------------------------------
    def _prepare(self, global_step: int, why: str) -> Tuple[Path, Callable[[], None]]:
        parts = distributed.gather_to_main(self._rank_part())
        loop: Dict[str, Any] = {}
        if parts is not None:  # rank 0
            loop = {
                "format": MANIFEST_FORMAT,
                "fingerprint": self.fingerprint,
                **self._copy(self._loop_state().state_dict()),
                "rng": [p["rng"] for p in parts],
                "per_rank": [p.get("own", {}) for p in parts],
                "world_size": self.ranks.world_size,
                "written": time.time(),
                "why": why,
            }
        state = self._shards().state_dict()
        if self.side is not None:
            state = self.stager.stage(state)
            barrier, agree, gather, group = self.side.barrier, self.side.any, self.side.gather_to_main, self.side.group
        else:
            group = None
            barrier, gather = distributed.control_barrier, distributed.gather_to_main
            agree = lambda failed: distributed.all_reduce_max_int(int(failed)) > 0  # noqa: E731
        started = time.perf_counter()

        def write() -> None:
            path = save_dcp(
                state,
                self.folder,
                global_step,
                loop,
                self.keep,
                is_main=self.ranks.is_main,
                barrier=barrier,
                agree=agree,
                gather=gather,  # each rank's hashes of its own shard files, for the manifest
                process_group=group,
            )
            if self.ranks.is_main:
                log.info(
                    "checkpoint %s/ written (%s, step %d, %d ranks' shards, %.2f s%s)",
                    path.name,
                    why,
                    global_step,
                    self.ranks.world_size,
                    time.perf_counter() - started,
                    ", in the background" if self.background else "",
                )

        return step_dir(self.folder, global_step), write

    # -- loading ------------------------------------------------------------------------
    def find(self) -> Tuple[Optional[Path], Optional[Dict[str, Any]]]:
        target = rundir.resume_target(self.resume, self.run_dir)
        if target is None:  # resume=never
            return super().find()
        self._remove_stale_temporaries()
        if rundir.is_checkpoint(target):
            path, loop = target, self._read(target)
        else:
            path, loop = self._newest_readable(target)
            if path is None and self.resume != "auto":
                raise CheckpointError(f"resume={self.resume}: no complete checkpoint in {target}")
        self._agree(loop)
        if loop is not None:
            self._check_fingerprint(path, loop)
            loop["path"] = str(path)
        return path, loop

    def _read(self, path: Path) -> Dict[str, Any]:
        if path.suffix == ".ckpt":
            raise CheckpointError(
                f"{path} is a checkpoint file of a strategy that does not shard; strategy=fsdp resumes from its own"
                " checkpoint directories (step_<N>/)"
            )
        return read_loop(path)

    def _newest_readable(self, folder: Path) -> Tuple[Optional[Path], Optional[Dict[str, Any]]]:
        """The newest complete checkpoint dir; torn ones are skipped with a warning, forged ones refused."""
        for path in rundir.list_checkpoints(folder):
            if path.suffix == ".ckpt":
                continue
            try:
                return path, self._read(path)
            except UnsafeCheckpoint:
                raise
            except CheckpointError as err:
                log.warning("skipping checkpoint: %s; falling back to the previous one", err)
        return None, None

    def restore(self, payload: Dict[str, Any]) -> None:
        path = Path(payload["path"])
        shards = self._shards()
        state = shards.state_dict()
        load_dcp(state, path, deep=False)  # the loop file's check already read the manifest
        shards.load_state_dict(state)
        self._loop_state().load_state_dict(payload)
        self._restore_rank_parts(payload, path_name=str(path))
