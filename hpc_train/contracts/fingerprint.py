"""What a checkpoint must share with the run that resumes from it, readable without torch.

Model, strategy, data, global batch, optimizer (and its parameter groups), a weight average, seed
and world size shape the weights, the optimizer state and the order of the samples; epochs,
max_steps, logging, the time limit and the launcher may change between attempts. The fingerprint is
stored in the checkpoint's header line, so the login node can refuse an incompatible resume before
queueing anything.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional

from hpc_train.config import DEFAULTS
from hpc_train.records import rundir

SECTIONS = ("model", "strategy", "data")
# A sharded (fsdp, mesh) checkpoint loads at any number of ranks and mesh shape, and into the other of the two: these
# may change on resume.
RESHARDABLE = (
    "world_size",
    "strategy.name",  # fsdp is a preset of mesh: their checkpoints are the same DCP directories
    "strategy.replicate",
    "strategy.reshard_after_forward",
    "strategy.cpu_offload",
    "strategy.dp_replicate",
    "strategy.dp_shard",
    "strategy.tp",
    "strategy.pp",
    "strategy.stages",  # a mesh's job spec carries its pipeline's stages (pp)
    "strategy.tp_plan",  # a mapping: its keys (strategy.tp_plan.<pattern>) go with it
    "strategy.split_points",
    "strategy.chunks",
    "strategy.balance",
    "strategy.schedule",
)


def fingerprint(
    spec: Mapping[str, Any], world_size: int, sharded: bool = False, any_world: bool = False
) -> Dict[str, Any]:
    """Flattened ``key -> value`` of the settings that must match; `spec` is the job spec (a plain dict).

    `sharded`: a torch.distributed.checkpoint of fsdp, which any layout can load, so the layout
    keys (RESHARDABLE) are left out. `any_world`: a replicated strategy's checkpoint (ddp's: one replica's state),
    which any number of ranks can load, so the world size is left out.
    """
    flat: Dict[str, Any] = {}

    def walk(prefix: str, value: Any) -> None:
        if isinstance(value, Mapping):
            for key in sorted(value):
                walk(f"{prefix}.{key}", value[key])
        elif isinstance(value, (list, tuple)):
            flat[prefix] = list(value)
        else:
            flat[prefix] = value

    for section in SECTIONS:
        walk(section, spec[section])
    flat["trainer.batch_size"] = int(spec["trainer"]["batch_size"])
    trainer = spec["trainer"]
    walk("trainer.optimizer", trainer["optimizer"])  # a name, or the keys of a _target_ node
    # Only when set, so checkpoints written before these keys existed still match: the optimizer's
    # state is laid out per parameter group, and a weight average must be in the checkpoint to resume it.
    if trainer.get("param_groups") not in (None, "single"):
        walk("trainer.param_groups", trainer["param_groups"])
    if trainer.get("ema_decay") is not None:
        flat["trainer.ema_decay"] = float(trainer["ema_decay"])
    flat["seed"] = int(spec["seed"])
    flat["world_size"] = int(world_size)
    if any_world:
        flat.pop("world_size", None)
    for key in RESHARDABLE if sharded else ():
        for name in [name for name in flat if name == key or name.startswith(f"{key}.")]:
            del flat[name]
    return json.loads(json.dumps(flat))  # plain JSON types, as read back from a header


def differences(saved: Mapping[str, Any], current: Mapping[str, Any]) -> List[str]:
    """``key: checkpoint X, this run Y`` for every setting that differs.

    A key one side lacks has its declared default (``hpc_train.config.DEFAULTS``): a checkpoint written
    before the login side filled in defaults (``config.engine.complete``) still matches.
    """
    lines = []
    for key in sorted(set(saved) | set(current)):
        if key not in current and key.split(".")[:2] in [k.split(".") for k in RESHARDABLE]:
            continue  # a layout key this run leaves out on purpose (ddp's world_size, a sharded run's dimensions)
        unset = DEFAULTS.get(key, "<unset>")
        old, new = saved.get(key, unset), current.get(key, unset)
        if old != new:
            lines.append(f"{key}: checkpoint {old!r}, this run {new!r}")
    return lines


def read_header_fingerprint(path: Path) -> Optional[Dict[str, Any]]:
    """The fingerprint of a checkpoint file (its header line) or directory (its manifest.json), without torch
    and without a checksum check; None if unreadable."""
    if Path(path).is_dir():
        try:
            found = json.loads((Path(path) / rundir.SHARDED_MANIFEST).read_text()).get("fingerprint")
        except (OSError, ValueError, AttributeError):
            return None
        return found if isinstance(found, dict) else None
    try:
        with open(path, "rb") as handle:
            handle.readline()
            return json.loads(handle.readline())
    except (OSError, ValueError):
        return None
