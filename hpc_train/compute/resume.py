"""Save a training run's full state and put it back: what makes a resumed run exact.

Rank 0 writes one file per checkpoint; every rank contributes its RNG states, and each owner of
parameters (rank 0, or the first replica of every pipeline stage) its model, optimizer and
GradScaler state, gathered over the CPU control group. On resume every rank reads the same
file, checks the fingerprint, and restores its own part.

Resume modes (the top-level ``resume`` key):
  * ``auto``: the newest checkpoint of the run dir that verifies (a torn or corrupt newest one
    is skipped with a warning); none: start from scratch.
  * ``never``: start from scratch; existing checkpoints are moved aside to
    ``checkpoints.replaced-<time>/`` (never deleted).
  * a path: that checkpoint file, or the newest valid one of a run dir / checkpoints folder.
"""

from __future__ import annotations

import logging
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, Dict, Optional, Tuple

from omegaconf import OmegaConf

from hpc_train.compute import distributed
from hpc_train.fingerprint import differences, fingerprint
from hpc_train.compute.checkpoint import (
    FORMAT,
    CheckpointError,
    capture_rng,
    checkpoint_dir,
    checkpoint_path,
    list_checkpoints,
    newest_valid,
    read_checkpoint,
    restore_rng,
    to_cpu,
    write_checkpoint,
)

log = logging.getLogger("hpc_train")


class Checkpointer:
    def __init__(self, cfg, trainer) -> None:
        self.cfg = cfg
        self.trainer = trainer
        self.folder = checkpoint_dir(trainer.run_dir)
        self.every = int(cfg.trainer.get("checkpoint_every") or 0)
        self.keep = int(cfg.trainer.get("keep_checkpoints") or 1)
        self.fingerprint = fingerprint(OmegaConf.to_container(cfg, resolve=True), trainer.ranks.world_size)
        self.last_saved_step: Optional[int] = None

    # -- saving -------------------------------------------------------------------------
    def due(self, global_step: int) -> bool:
        return self.every > 0 and global_step % self.every == 0

    def save(self, why: str) -> Optional[Path]:
        """Write a checkpoint of the current state (a collective: every rank calls it)."""
        t = self.trainer
        state = t.state
        if self.last_saved_step == state.global_step:
            return None
        started = time.perf_counter()
        strategy = t.strategy
        part: Dict[str, Any] = {"rng": capture_rng()}
        if strategy.owns_checkpoint_shard:
            shard = {"model": to_cpu(strategy.unwrap(t.wrapped).state_dict()), "optimizer": to_cpu(t.optimizer.state_dict())}
            if t.scaler is not None:
                shard["scaler"] = t.scaler.state_dict()
            part["shard"] = (strategy.checkpoint_key, shard)
        parts = distributed.gather_to_main(part)
        path = checkpoint_path(t.run_dir, state.global_step)
        if parts is not None:  # rank 0
            payload = {
                "format": FORMAT,
                "fingerprint": self.fingerprint,
                "state": asdict(state),
                "scheduler": t.scheduler.state_dict(),
                "rng": [p["rng"] for p in parts],
                "shards": dict(p["shard"] for p in parts if "shard" in p),
                "world_size": t.ranks.world_size,
                "written": time.time(),
                "why": why,
            }
            write_checkpoint(payload, path, self.keep)
            log.info("checkpoint %s written (%s, step %d, %.2f s)", path.name, why, state.global_step, time.perf_counter() - started)
        # No rank moves on (or exits after a stop signal, which under srun --kill-on-bad-exit
        # would kill rank 0 mid-write) before the file is complete.
        distributed.control_barrier()
        self.last_saved_step = state.global_step
        return path

    # -- loading ------------------------------------------------------------------------
    def find(self) -> Tuple[Optional[Path], Optional[Dict[str, Any]]]:
        """The checkpoint this run resumes from, per the ``resume`` key (every rank calls it)."""
        mode = str(self.cfg.resume)
        if mode == "never":
            if self.trainer.ranks.is_main and list_checkpoints(self.folder):
                aside = self.folder.with_name(f"{self.folder.name}.replaced-{time.strftime('%Y%m%d-%H%M%S')}")
                self.folder.rename(aside)
                log.warning("resume=never: the existing checkpoints were moved to %s", aside)
            return None, None
        if mode == "auto":
            path, payload = newest_valid(self.folder)
        else:
            target = Path(mode).expanduser()
            if target.is_dir():
                folder = target / "checkpoints" if (target / "checkpoints").is_dir() else target
                path, payload = newest_valid(folder)
                if path is None:
                    raise CheckpointError(f"resume={mode}: no valid checkpoint in {folder}")
            else:
                path, payload = target, read_checkpoint(target)
        self._agree(payload)
        if payload is not None:
            changed = differences(payload["fingerprint"], self.fingerprint)
            if changed:
                raise CheckpointError(
                    f"checkpoint {path} comes from an incompatible run:\n  " + "\n  ".join(changed)
                    + "\nFix: run with the checkpoint's settings, or start over with resume=never or a fresh hydra.run.dir."
                )
        return path, payload

    def _agree(self, payload: Optional[Dict[str, Any]]) -> None:
        """Every rank must have picked the same checkpoint (a shared file system can lag)."""
        step = -1 if payload is None else int(payload["state"]["global_step"])
        highest = distributed.all_reduce_max_int(step)
        lowest = -distributed.all_reduce_max_int(-step)
        if highest != lowest:
            raise CheckpointError(f"ranks found different checkpoints to resume from (steps {lowest} to {highest}): is the run dir on a shared file system?")

    def restore(self, payload: Dict[str, Any]) -> None:
        """Put model, optimizer, scheduler, scaler, loop position and this rank's RNG back."""
        t = self.trainer
        key = t.strategy.checkpoint_key
        if key not in payload["shards"]:
            raise CheckpointError(f"the checkpoint has no parameters for {key} (it has {sorted(payload['shards'])})")
        shard = payload["shards"][key]
        t.strategy.unwrap(t.wrapped).load_state_dict(shard["model"])
        t.optimizer.load_state_dict(shard["optimizer"])
        if t.scaler is not None and "scaler" in shard:
            t.scaler.load_state_dict(shard["scaler"])
        t.scheduler.load_state_dict(payload["scheduler"])
        for name, value in payload["state"].items():
            setattr(t.state, name, value)
        restore_rng(payload["rng"][t.ranks.rank])
        self.last_saved_step = t.state.global_step
