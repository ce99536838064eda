"""Sharded checkpoint save: rank 0's time against the slowest other rank's, before and after spreading the hashing.

A DCP checkpoint's ``manifest.json`` lists the size and sha256 of every file. Before, rank 0
read back and hashed every rank's shard files while the others waited in the next collective;
after, each rank hashes the files it wrote and rank 0 gathers the small entries (and hashes
only .metadata and loop.pt, which it alone writes).

Method: W rank processes (this script with ``--worker``, 1 intra-op thread each, gloo on a free
local port) build the ~50 M-parameter ``TinyLM`` of benchmarks/fsdp_memory.py (its
``build_model``), wrap it with hpc_train's ``FSDPStrategy`` (``fully_shard`` per block, then the
root), take one AdamW step (so the optimizer state exists) and save
``get_state_dict(model, optimizer)`` as the fsdp strategy does (``{"model", "optim"}``) with
``dcp_save.save_dcp`` and the collectives ``ShardedCheckpointer`` passes it. Per repeat one "before"
and one "after" save, alternating which goes first. "before" runs the same ``save_dcp`` with
the old manifest writer (a copy of it below, not in src, patched in as ``dcp_save._write_rank0_files``)
and no per-rank hashing (``dcp_save.file_entries`` patched to hash nothing).

Per save and rank: *ready* = seconds from the common start (a barrier) until the rank has done
its own part (dcp.save, its hashing; rank 0 also its loop.pt and the manifest): rank 0 when it
enters the agreement after the manifest, another rank when it enters the gather of the hashes
(after that it only waits); *total* = until ``save_dcp`` returns (the stall a training loop sees, the
same on every rank); *hashed* = bytes this rank read to hash. Figures: median (min-max) over
the repeats; "slowest other" is the maximum over ranks 1..W-1 of each save. Also timed: a deep
verification of the checkpoint (``dcp_manifest.verify(deep=True)``), every rank hashing every file (before)
against each rank hashing its share (after), slowest rank.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Dict, Iterator, List

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import PYTHON, REPO, cpu_env, fmt_stats, import_root, machine_info, stats, wait_ranks, write_result  # noqa: E402
from fsdp_memory import build_model, free_port  # noqa: E402  the model of the FSDP memory benchmark

FULL = {"dim": 768, "vocab": 8192, "layers": 8, "worlds": [2, 4], "repeats": 5}
QUICK = {"dim": 352, "vocab": 4096, "layers": 8, "worlds": [2], "repeats": 2}
MODES = ("before", "after")
MB = 1e6


# -- the old code path (rank 0 hashes every file), kept here only ---------------------------------
# The save is dcp_save.save_dcp; the manifest's names and hashing are dcp_manifest's (split out of dcp.py).
def old_write_manifest(folder: Path, step: int, extra: Dict[str, Any]) -> None:
    """The old ``_write_manifest``: rank 0 reads back and hashes every file of the dir."""
    from hpc_train.compute.checkpointing import dcp_manifest
    from hpc_train.records import rundir

    files = {}
    for file in sorted(Path(folder).iterdir()):
        if file.name != dcp_manifest.MANIFEST and file.is_file():
            files[file.name] = {"size": file.stat().st_size, "sha256": dcp_manifest._sha256(file)}
    manifest: Dict[str, Any] = {"format": dcp_manifest.MANIFEST_FORMAT, "step": step, "files": files}
    try:
        manifest["fingerprint"] = json.loads(json.dumps(extra.get("fingerprint")))
    except (TypeError, ValueError):
        pass
    rundir.write_durable(Path(folder) / dcp_manifest.MANIFEST, json.dumps(manifest, indent=1).encode())


def old_write_rank0_files(tmp: Path, step: int, extra: Dict[str, Any], hashed: Any = None) -> None:
    """The old ``_write_rank0_files`` (it ignores the ranks' entries: there were none)."""
    import io

    import torch

    from hpc_train.compute.checkpointing import dcp_manifest
    from hpc_train.records import rundir

    buffer = io.BytesIO()
    torch.save(extra, buffer)
    rundir.write_durable(tmp / dcp_manifest.LOOP, buffer.getvalue())
    old_write_manifest(tmp, step, extra)
    rundir.fsync_path(tmp)


@contextmanager
def code_path(mode: str) -> Iterator[None]:
    """ "before": the old rank-0-hashes-all manifest and no per-rank hashing; "after": src as it is.

    save_dcp looks both up in dcp_save's namespace (file_entries is imported there from dcp_manifest),
    so that is where they are replaced.
    """
    from hpc_train.compute.checkpointing import dcp_save

    if mode == "after":
        yield
        return
    saved = dcp_save._write_rank0_files, dcp_save.file_entries
    dcp_save._write_rank0_files, dcp_save.file_entries = old_write_rank0_files, lambda folder, names: {}
    try:
        yield
    finally:
        dcp_save._write_rank0_files, dcp_save.file_entries = saved


@contextmanager
def hashing_meter(meter: Dict[str, float]) -> Iterator[None]:
    """Count the bytes and seconds this process spends in the checkpoint manifest's sha256.

    dcp_manifest._sha256 is called through the module's globals by file_entries (the per-rank
    hashing and the manifest's own files), check_file (verify) and old_write_manifest above.
    """
    from hpc_train.compute.checkpointing import dcp_manifest

    original = dcp_manifest._sha256

    def metered(path: Path) -> str:
        start = time.perf_counter()
        digest = original(path)
        meter["hash_s"] += time.perf_counter() - start
        meter["hashed_bytes"] += os.path.getsize(path)
        return digest

    dcp_manifest._sha256 = metered
    try:
        yield
    finally:
        dcp_manifest._sha256 = original


# -- the worker (one rank) ---------------------------------------------------------------
def _fsdp_model(args: argparse.Namespace, info: Any) -> Any:
    import torch

    from hpc_train.compute.parallel.base import StrategySetup
    from hpc_train.compute.parallel.fsdp import FSDPSettings, FSDPStrategy
    from hpc_train.compute.settings import LayoutSettings

    torch.manual_seed(0)
    model = build_model(args.dim, args.vocab, args.layers)
    settings = FSDPSettings("fsdp", "auto", replicate=1, reshard_after_forward=True, cpu_offload=False, wrap=None)
    world = info.world_size
    layout = LayoutSettings("fsdp", 1, world, world, 1, 1, [1, world], world, world)  # as the launch side lays it out
    setup = StrategySetup(settings, info, [torch.device("cpu")], "32", False, None, None, (), layout)
    return FSDPStrategy(setup).wrap(model)


def _one_step(model: Any, vocab: int) -> Any:
    """One AdamW step on a few random tokens: the optimizer state (exp_avg, exp_avg_sq) then exists."""
    import torch

    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    tokens = torch.randint(0, vocab, (2, 9), generator=torch.Generator().manual_seed(1))
    loss = torch.nn.functional.cross_entropy(model(tokens[:, :-1]).reshape(-1, vocab), tokens[:, 1:].reshape(-1))
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return optimizer


def _timed_save(model: Any, optimizer: Any, folder: Path, step: int, is_main: bool) -> Dict[str, float]:
    """One save as ShardedCheckpointer makes it; ready (entering the last-but-one agreement) and total seconds."""
    from torch.distributed.checkpoint.state_dict import get_state_dict

    from hpc_train.compute.checkpointing import dcp_save
    from hpc_train.compute.runtime import distributed

    model_state, optim_state = get_state_dict(model, optimizer)
    calls: List[float] = []

    gathered: List[float] = []

    def agree(failed: bool) -> bool:
        calls.append(time.perf_counter())
        return distributed.all_reduce_max_int(int(failed)) > 0

    def gather(obj: Any) -> Any:
        gathered.append(time.perf_counter())
        return distributed.gather_to_main(obj)

    meter = {"hash_s": 0.0, "hashed_bytes": 0.0}
    loop = {"fingerprint": {"benchmark": "checkpoint_save"}, "step": step}
    distributed.control_barrier()
    start = time.perf_counter()
    with hashing_meter(meter):
        dcp_save.save_dcp(
            {"model": model_state, "optim": optim_state},
            folder,
            step,
            loop,
            1,
            is_main,
            distributed.control_barrier,
            agree,
            gather,
        )
    total = time.perf_counter() - start
    # Own part done: rank 0 when it enters the 2nd agreement (its loop.pt and manifest written); another
    # rank when it enters the gather of the hashes (after it, it only waits for rank 0 and the rename).
    done = calls[1] if is_main else gathered[0]
    return {"ready_s": done - start, "total_s": total, **meter}


def _timed_verify(path: Path, spread: bool) -> Dict[str, float]:
    from hpc_train.compute.checkpointing import dcp_manifest
    from hpc_train.compute.runtime import distributed

    meter = {"hash_s": 0.0, "hashed_bytes": 0.0}
    distributed.control_barrier()
    start = time.perf_counter()
    with hashing_meter(meter):
        dcp_manifest.verify(path, deep=True, peers=dcp_manifest.process_group_peers() if spread else None)
    return {"verify_s": time.perf_counter() - start, **meter}


def worker(args: argparse.Namespace) -> None:
    import torch

    from hpc_train.compute.checkpointing import dcp_dirs, dcp_manifest
    from hpc_train.compute.runtime import distributed
    from hpc_train.compute.runtime.ranks import RankInfo

    torch.set_num_threads(1)
    info = RankInfo(args.rank, args.rank, args.world, args.world, "127.0.0.1", args.port, "local")
    distributed.init_process_group(info, "gloo", 600.0, torch.device("cpu"))
    model = _fsdp_model(args, info)
    optimizer = _one_step(model, args.vocab)
    folder, is_main = Path(args.folder), args.rank == 0
    saves: List[Dict[str, Any]] = []
    verifies: List[Dict[str, Any]] = []
    step = 0
    for repeat in range(args.repeats):
        order = MODES if repeat % 2 == 0 else MODES[::-1]
        for mode in order:
            step += 1
            with code_path(mode):
                saves.append({"mode": mode, "repeat": repeat, **_timed_save(model, optimizer, folder, step, is_main)})
            path = dcp_dirs.step_dir(folder, step)
            for spread in (False, True) if mode == "after" else ():
                verifies.append(
                    {"mode": "after" if spread else "before", "repeat": repeat, **_timed_verify(path, spread)}
                )
    final = dcp_dirs.step_dir(folder, step)
    manifest = dcp_manifest.verify(
        final, deep=True, peers=dcp_manifest.process_group_peers()
    )  # the last save is correct
    record = {
        "rank": args.rank,
        "world": args.world,
        "model_params": sum(p.numel() for p in model.parameters()),  # DTensors: global numel
        "checkpoint_bytes": dcp_dirs.checkpoint_bytes(final),
        "files": len(manifest["files"]),
        "saves": saves,
        "verifies": verifies,
    }
    Path(args.out).write_text(json.dumps(record))
    distributed.teardown()


# -- the driver ----------------------------------------------------------------------------
def launch(world: int, params: Dict[str, Any], tmp: Path, timeout: float = 900.0) -> List[Dict[str, Any]]:
    """One run of `world` fresh rank processes; every rank's record."""
    port = free_port()
    pythonpath = os.pathsep.join(x for x in (str(import_root(REPO)), os.environ.get("PYTHONPATH", "")) if x)
    env = cpu_env(1) | {"PYTHONPATH": pythonpath}
    outs = [tmp / f"w{world}-rank{r}.json" for r in range(world)]
    model_args = [f"--{k}={params[k]}" for k in ("dim", "vocab", "layers", "repeats")]
    procs = [
        subprocess.Popen(
            [
                PYTHON,
                str(Path(__file__).resolve()),
                "--worker",
                f"--world={world}",
                f"--rank={r}",
                f"--port={port}",
                f"--folder={tmp / f'w{world}' / 'checkpoints'}",
                f"--out={outs[r]}",
                *model_args,
            ],
            env=env,
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for r in range(world)
    ]
    failed = wait_ranks(procs, timeout)
    if failed:
        raise RuntimeError(f"W={world} failed:\n" + "\n".join(failed))
    return [json.loads(p.read_text()) for p in outs]


def summarise(ranks: List[Dict[str, Any]]) -> Dict[str, Any]:
    """Per mode: rank 0's and the slowest other rank's ready time, total save time, hashed bytes, deep verify."""
    world = len(ranks)
    out: Dict[str, Any] = {
        "world": world,
        "checkpoint_mb": ranks[0]["checkpoint_bytes"] / MB,
        "files": ranks[0]["files"],
    }
    for mode in MODES:
        per_rank = [[s for s in r["saves"] if s["mode"] == mode] for r in ranks]
        repeats = len(per_rank[0])
        verify = [[v for v in r["verifies"] if v["mode"] == mode] for r in ranks]
        out[mode] = {
            "rank0_ready_s": stats([per_rank[0][i]["ready_s"] for i in range(repeats)]),
            "slowest_other_ready_s": stats(
                [max(per_rank[r][i]["ready_s"] for r in range(1, world)) for i in range(repeats)]
            ),
            "total_s": stats([max(per_rank[r][i]["total_s"] for r in range(world)) for i in range(repeats)]),
            "rank0_hashed_mb": stats([per_rank[0][i]["hashed_bytes"] / MB for i in range(repeats)]),
            "max_other_hashed_mb": stats(
                [max(per_rank[r][i]["hashed_bytes"] for r in range(1, world)) / MB for i in range(repeats)]
            ),
            "deep_verify_s": stats(
                [max(verify[r][i]["verify_s"] for r in range(world)) for i in range(len(verify[0]))]
            ),
        }
    return out


def table(results: List[Dict[str, Any]]) -> List[str]:
    """Markdown rows: one per world size and code path."""
    lines = [
        "| W | checkpoint | code path | rank 0 ready s | slowest other ready s | save s (total) | rank 0 hashed "
        "MB | max other hashed MB | deep verify s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for res in results:
        for mode in MODES:
            m = res[mode]
            lines.append(
                f"| {res['world']} | {res['checkpoint_mb']:.0f} MB | {mode} | {fmt_stats(m['rank0_ready_s'])} | "
                f"{fmt_stats(m['slowest_other_ready_s'])}"
                f" | {fmt_stats(m['total_s'])} | {m['rank0_hashed_mb']['median']:.0f} | "
                f"{m['max_other_hashed_mb']['median']:.0f} | {fmt_stats(m['deep_verify_s'])} |"
            )
    return lines


def run(quick: bool = False, **overrides: Any) -> Dict[str, Any]:
    params = {**(QUICK if quick else FULL), **overrides}
    info = machine_info(busy_seconds=1.0)
    results = []
    with tempfile.TemporaryDirectory(prefix="ckpt-save-bench-") as tmp:
        for world in params["worlds"]:
            print(f"W={world}: {params['repeats']} repeats of before/after ...", flush=True)
            started = time.perf_counter()
            ranks = launch(world, params, Path(tmp))
            results.append({**summarise(ranks), "wall_s": round(time.perf_counter() - started, 1), "ranks": ranks})
    record = {"params": params, "machine": info, "load_avg_after": os.getloadavg(), "results": results}
    print("\n".join(table(results)))
    path = write_result("checkpoint_save" + ("_quick" if quick else ""), record)
    print(f"wrote {path}")
    return record


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--quick", action="store_true", help="a smaller model, W=2 only")
    parser.add_argument("--world", type=int, default=2)
    parser.add_argument("--rank", type=int, default=0)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--folder", default="")
    parser.add_argument("--out", default="")
    parser.add_argument("--dim", type=int, default=FULL["dim"])
    parser.add_argument("--vocab", type=int, default=FULL["vocab"])
    parser.add_argument("--layers", type=int, default=FULL["layers"])
    parser.add_argument("--repeats", type=int, default=None)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return
    overrides = {"repeats": args.repeats} if args.repeats else {}
    run(quick=args.quick, **overrides)


if __name__ == "__main__":
    main()
