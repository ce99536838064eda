"""``hpc-train-export RUN_DIR [--step N] [--ema] OUT.pt``: the full weights of a sharded (fsdp) checkpoint as one file.

``strategy=fsdp`` checkpoints are DCP directories, one shard file per rank, that only DCP can
read. This command, on one process without GPUs or a process group, assembles the full model
state dict of the newest complete checkpoint (or of step N) and writes it with ``torch.save``:
``torch.load(OUT.pt, weights_only=True)`` then gives ``{param name: tensor}`` for
``model.load_state_dict``. Nothing in the checkpoint is unpickled beyond tensors, plain values
and DCP's allow-listed metadata classes (hpc_train.compute.checkpointing.dcp_metadata).

``--ema`` writes the weight average of ``trainer.ema_decay`` instead, from an fsdp checkpoint
dir or from the single-file checkpoints (``step_<N>.ckpt``) of the other strategies; its keys
are the model's parameter names (buffers are not averaged: take them from the model).

Errors are one line on stderr and exit code 2 (``hpc_train.records.rundir.EXIT_REFUSED``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import List, Optional

from hpc_train.errors import RunDirRefused
from hpc_train.records import rundir


class ExportError(RunDirRefused, RuntimeError):
    """Nothing to export from the given run dir; ``str(err)`` says why."""


def _checkpoints_folder(run_dir: Path) -> Path:
    """A run dir's checkpoints/ folder; a checkpoints folder itself is accepted too."""
    run_dir = Path(run_dir)
    folder = rundir.checkpoint_dir(run_dir)
    if folder.is_dir():
        return folder
    if run_dir.is_dir() and run_dir.name == rundir.CHECKPOINTS:
        return run_dir
    if not run_dir.is_dir():
        raise ExportError(f"{run_dir} is not a directory (expected a run dir with a {rundir.CHECKPOINTS}/ folder)")
    raise ExportError(f"{run_dir} has no {rundir.CHECKPOINTS}/ folder: no checkpoint was written there")


def find_checkpoint(run_dir: Path, step: Optional[int] = None) -> Path:
    """The checkpoint dir to export: step `step`, or the newest complete one."""
    # these import torch and torch.distributed.checkpoint (seconds): only once the arguments parsed
    from hpc_train.compute.checkpointing.dcp_dirs import list_dcp_checkpoints, newest_complete, step_dir
    from hpc_train.compute.checkpointing.dcp_manifest import MANIFEST

    if step is None and (Path(run_dir) / MANIFEST).is_file():
        return Path(run_dir)  # a checkpoint dir itself
    folder = _checkpoints_folder(run_dir)
    found = list_dcp_checkpoints(folder)
    if not found:
        weights = Path(run_dir) / rundir.WEIGHTS
        if any(p.is_file() for p in folder.glob("step_*.ckpt")):
            where = f"its final weights are {weights}" if weights.is_file() else f"its final weights go to {weights}"
            raise ExportError(
                f"{folder} holds single-file checkpoints (step_<N>.ckpt) of a non-sharded strategy, not fsdp"
                f" checkpoint dirs: there is nothing to consolidate; {where} (torch.load(..., weights_only=True))"
            )
        raise ExportError(f"{folder} has no fsdp checkpoint dirs (step_<N>/)")
    if step is not None:
        path = step_dir(folder, step)
        if path not in found:
            steps = ", ".join(str(rundir.checkpoint_step(p)) for p in found)
            raise ExportError(f"{folder} has no checkpoint of step {step} (it has steps {steps})")
        return path
    path = newest_complete(folder)
    if path is None:
        raise ExportError(f"{folder} has no complete checkpoint (every step_<N>/ there is truncated or corrupt)")
    return path


def _save_atomic(obj: object, out: Path) -> None:
    """``torch.save`` to a temporary file beside `out`, fsync, rename: never a torn OUT.pt; a full disk is one
    message."""
    from hpc_train.compute.checkpointing.files import save_atomic  # heavy (torch): only once the arguments parsed

    save_atomic(
        obj,
        out,
        f"the export {out.name}",
        f"Nothing was written to {out}. Fix: free space there or export to another path.",
    )


def export(run_dir: Path, out: Path, step: Optional[int] = None, ema: bool = False) -> Path:
    """Write the full model weights (or, with `ema`, the weight average) of `run_dir`'s newest complete checkpoint
    (or `step`) to `out`; returns `out`."""
    from hpc_train.compute.checkpointing.dcp_consolidate import consolidate  # heavy (torch, DCP): as above

    if ema and _single_file_checkpoints(Path(run_dir)):
        state = _ema_of_checkpoint_file(Path(run_dir), step)
    else:
        path = find_checkpoint(Path(run_dir), step)
        state = consolidate(path, "ema." if ema else "model.")
    out = Path(out)
    _save_atomic(state, out)
    return out


def _single_file_checkpoints(run_dir: Path) -> bool:
    folder = rundir.checkpoint_dir(run_dir)
    return folder.is_dir() and any(p.suffix == ".ckpt" for p in rundir.list_checkpoints(folder))


def _ema_of_checkpoint_file(run_dir: Path, step: Optional[int]) -> dict:
    """The weight average saved in a step_<N>.ckpt (the newest valid one, or step `step`)."""
    from hpc_train.compute.checkpointing.files import newest_valid, read_checkpoint  # heavy (torch): as above

    folder = rundir.checkpoint_dir(run_dir)
    if step is None:
        path, payload = newest_valid(folder)
        if payload is None:
            raise ExportError(f"{folder} has no valid checkpoint")
    else:
        path = rundir.checkpoint_path(run_dir, step)
        if not path.is_file():
            raise ExportError(f"{folder} has no checkpoint of step {step}")
        payload = read_checkpoint(path)
    averages = [shard["ema"] for shard in payload["shards"].values() if "ema" in shard]
    if not averages:
        raise ExportError(f"checkpoint {path} holds no weight average: the run had trainer.ema_decay=null")
    return {name: tensor for average in averages for name, tensor in average.items()}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hpc-train-export",
        description="Write the full model weights of a sharded (strategy=fsdp) checkpoint as one torch.save file.",
    )
    parser.add_argument(
        "run_dir",
        type=Path,
        metavar="RUN_DIR",
        help="the run dir (or its checkpoints/ folder, or one checkpoint dir step_<N>/)",
    )
    parser.add_argument("out", type=Path, metavar="OUT.pt", help="where to write the state dict")
    parser.add_argument("--step", type=int, default=None, help="export this step (default: the newest complete one)")
    parser.add_argument(
        "--ema", action="store_true", help="export the weight average of trainer.ema_decay instead of the weights"
    )
    return parser


def main(argv: Optional[List[str]] = None) -> int:
    args = _parser().parse_args(argv)
    from hpc_train.compute.checkpointing.files import CheckpointError  # heavy (torch): --help stays instant

    try:
        out = export(args.run_dir, args.out, args.step, ema=args.ema)
    except (ExportError, CheckpointError, OSError) as err:
        print(f"hpc-train-export: {' '.join(str(err).split())}", file=sys.stderr)
        return rundir.EXIT_REFUSED
    print(f"wrote {out}")
    return rundir.EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
