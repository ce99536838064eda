"""Background checkpoints: how long a save blocks training, async against sync, and what the write costs the steps.

Method: each run is the real command line, ``hpc-train strategy=ddp|fsdp resources.gpus_per_node=2`` (the local
launcher, 2 gloo ranks on the CPU, 1 intra-op thread each), training ``image_tinylm`` below (the ``TinyLM`` blocks of
benchmarks/fsdp_memory.py on flattened 32x32 synthetic images: ~27 M parameters at dim 512, ~104 M at dim 1024, 12
blocks each) with the default optimizer (SGD with momentum: the checkpoint holds 2x the parameters), a metrics row
every step (``trainer.log_every=1``) and a checkpoint every ``every`` steps, with ``trainer.async_checkpoint=true``
(staged, then written by a thread) and ``=false`` (written before the loop goes on); the two runs of a case alternate
which goes first. Everything is read from the run's metrics.jsonl:

* *blocked*: a periodic save's ``blocked_s``: async, the staging, over the saves whose write ended before the next
  save (a save that training had to wait for, because its row came only at the next save's step, is counted apart);
  sync, the whole save. The final save (a few steps after the last periodic one) always waits until it is written
  and is left out. The figure: median async over median sync (target <= 0.2).
* *write*: an async save's ``total_s``, from the start of the save to its checkpoint installed on every rank.
* *step time*: step k spans the ``time`` of the train rows k-1 and k; after a save at step k-1 it starts when the save
  stopped blocking (its ``blocked_s`` later). The write of the save at step S runs from the train row of step S (the
  save starts right after it) + ``blocked_s`` to that row + ``total_s``. A step is *clear* when no write covers any of
  it, *in flight* when one covers some of it (*whole*: all of it; *part*: with the share covered). The first ``warmup``
  steps, and the steps that held a wait for a write, are left out. Figure: median in-flight step over median clear
  step, in the async run (the sync run's steps, all clear, are in the JSON).
* *saved per save*: all costs together: the time from the end of the warm-up to the last step, sync run minus async
  run, over the periodic saves (one run each: step-time noise of the two runs is in it).

Reference (plain PyTorch, same file system, 1 thread): the same model and optimizer after one step, ``torch.save`` of
``{"model": state_dict, "optim": state_dict}`` to a new file (and with fsync), and a clone of every tensor of that state
(what staging costs alone).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from common import (  # noqa: E402  (benchmarks/ on sys.path first)
    PYTHON,
    REPO,
    RESULTS,
    cpu_env,
    fmt_stats,
    foreign_cpu,
    hpc_train_cmd,
    import_root,
    load,
    machine_info,
    run_checked,
    stats,
    write_result,
)
from fsdp_memory import build_model  # noqa: E402  the model of the FSDP memory benchmark

SIZES = {
    "25M": {"dim": 512, "layers": 12},
    "100M": {"dim": 1024, "layers": 12},
    "3M": {"dim": 256, "layers": 4},
}  # 3M: quick
FULL = {
    "sizes": ["25M", "100M"],
    "strategies": ["ddp", "fsdp"],
    "every": 6,
    "saves": 4,
    "batch": 16,
    "warmup": 2,
    "ref_repeats": 3,
}
QUICK = {
    "sizes": ["3M"],
    "strategies": ["ddp", "fsdp"],
    "every": 3,
    "saves": 3,
    "batch": 16,
    "warmup": 1,
    "ref_repeats": 2,
}
IMAGE_SIZE, CLASSES = 32, 10
TARGET = 0.2  # async blocked <= TARGET x sync blocked
MB = 1e6


def image_tinylm(image_size: int, num_classes: int, hidden: int, layers: int, in_channels: int = 3) -> Any:
    """fsdp_memory's TinyLM with its token embedding replaced by a linear map of the flattened image (the trainer's
    built-in step feeds images and class labels); the head maps to the classes. The config names it with
    ``_target_``."""
    import torch.nn as nn

    model = build_model(hidden, num_classes, layers)
    model.embed = nn.Sequential(nn.Flatten(), nn.Linear(in_channels * image_size * image_size, hidden))
    return model


# -- one hpc-train run ------------------------------------------------------------------------------------
def total_steps(params: Dict[str, Any]) -> int:
    """`saves` periodic saves, then a few steps (the last write may end before the final save waits for it)."""
    return params["every"] * params["saves"] + params["every"] // 2 + 1


def train_args(size: str, strategy: str, async_save: bool, params: Dict[str, Any], run_dir: Path) -> List[str]:
    model, steps = SIZES[size], total_steps(params)
    return [
        f"strategy={strategy}",
        "resources.gpus_per_node=2",
        "model=toy_mlp",
        "model._target_=async_checkpoint.image_tinylm",
        f"model.hidden={model['dim']}",
        f"+model.layers={model['layers']}",
        "data=synthetic",
        f"data.image_size={IMAGE_SIZE}",
        f"data.num_classes={CLASSES}",
        f"data.num_samples={max(512, steps * params['batch'])}",
        f"trainer.max_steps={steps}",
        "trainer.epochs=null",
        f"trainer.batch_size={params['batch']}",
        "trainer.eval=false",
        "trainer.progress=false",
        "trainer.log_every=1",
        f"trainer.checkpoint_every={params['every']}",
        "trainer.keep_checkpoints=2",
        f"trainer.async_checkpoint={str(async_save).lower()}",
        f"hydra.run.dir={run_dir}",
    ]


def bench_env() -> Dict[str, str]:
    """1 thread a rank, GPUs hidden; this folder importable by the ranks (the model's _target_)."""
    path = os.pathsep.join(x for x in (str(HERE), str(import_root(REPO)), os.environ.get("PYTHONPATH", "")) if x)
    return cpu_env(1) | {"PYTHONPATH": path}


def run_once(size: str, strategy: str, async_save: bool, params: Dict[str, Any], run_dir: Path) -> Dict[str, Any]:
    """One training run; its checkpoint rows, train row times, wall time and the other processes' CPU meanwhile."""
    load_before = load()
    started = time.perf_counter()
    _, foreign = foreign_cpu(
        lambda: run_checked(
            hpc_train_cmd(train_args(size, strategy, async_save, params, run_dir)),
            env=bench_env(),
            cwd=REPO,
            timeout=1800,
        )
    )
    wall = time.perf_counter() - started
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    summary = json.loads((run_dir / "summary.json").read_text())
    return {
        "size": size,
        "strategy": strategy,
        "async": async_save,
        "wall_s": round(wall, 1),
        "foreign_cores": foreign,
        "load_before": load_before,
        "load_after": load(),
        "checkpoint_blocked_s": summary.get("checkpoint_blocked_s"),
        "last_step": summary["global_step"],
        "train_times": {r["step"]: r["time"] for r in rows if r["kind"] == "train"},
        "checkpoints": [
            {k: r[k] for k in ("step", "blocked_s", "total_s", "bytes", "async", "time")}
            for r in rows
            if r["kind"] == "checkpoint"
        ],
    }


def periodic_saves(run: Dict[str, Any], every: int) -> List[Dict[str, Any]]:
    """The run's periodic saves (the final one left out), each marked `waited` when training had to wait for its
    write: its row was written at or after the train row of the next save's step (the next save, or the final one,
    collected it)."""
    times = {int(k): v for k, v in run["train_times"].items()}
    last = run["last_step"]
    return [
        {**c, "next": min(c["step"] + every, last), "waited": c["time"] >= times[min(c["step"] + every, last)]}
        for c in run["checkpoints"]
        if c["step"] < last
    ]


def classify_steps(run: Dict[str, Any], every: int, warmup: int) -> Dict[str, Any]:
    """Step times by how much of them a background write covered (see the module docstring).

    Step k spans the train rows k-1 and k; after a save at k-1 it starts when the save stopped blocking (its
    blocked_s later). The steps holding a wait for a write (after the next save of a waited-for one) are left out."""
    times = {int(k): v for k, v in run["train_times"].items()}
    saves = periodic_saves(run, every)
    shift = {c["step"] + 1: c["blocked_s"] for c in saves if not c["waited"]}
    excluded = {s for c in saves if c["waited"] for s in (c["step"] + 1, c["next"] + 1)}
    writes = (
        [(times[c["step"]] + shift.get(c["step"] + 1, 0.0), times[c["step"]] + c["total_s"]) for c in saves]
        if run["async"]
        else []
    )
    out: Dict[str, List[float]] = {"during": [], "partial": [], "partial_covered": [], "clear": []}
    for step in sorted(times):
        if step <= warmup or step in excluded or step - 1 not in times:
            continue
        begin, end = times[step - 1] + shift.get(step, 0.0), times[step]
        covered = sum(max(0.0, min(end, w1) - max(begin, w0)) for w0, w1 in writes) / (end - begin)
        kind = "clear" if covered <= 0 else ("during" if covered >= 0.999 else "partial")
        out[kind].append(end - begin)
        if kind == "partial":
            out["partial_covered"].append(covered)
    return out


def _stats(values: List[float]) -> Optional[Dict[str, float]]:
    return stats(values) if values else None


def summarise_case(sync: Dict[str, Any], asyn: Dict[str, Any], every: int, warmup: int) -> Dict[str, Any]:
    """The figures of one size x strategy from its sync and async runs."""
    s_saves, a_saves = periodic_saves(sync, every), periodic_saves(asyn, every)
    a_free = [c for c in a_saves if not c["waited"]]  # blocked = staging alone
    s_blocked, a_blocked = stats([c["blocked_s"] for c in s_saves]), _stats([c["blocked_s"] for c in a_free])
    a_steps, s_steps = classify_steps(asyn, every, warmup), classify_steps(sync, every, warmup)
    overlapped, clear = _stats(a_steps["during"] + a_steps["partial"]), _stats(a_steps["clear"])
    ratio = a_blocked["median"] / s_blocked["median"] if a_blocked else None
    return {
        "size": sync["size"],
        "strategy": sync["strategy"],
        "checkpoint_mb": s_saves[0]["bytes"] / MB,
        "sync_blocked_s": s_blocked,
        "async_blocked_s": a_blocked,
        "blocked_ratio": ratio,
        "meets_target": ratio is not None and ratio <= TARGET,
        "async_waited_saves": len(a_saves) - len(a_free),
        "async_waited_blocked_s": [c["blocked_s"] for c in a_saves if c["waited"]],
        "async_write_s": stats([c["total_s"] for c in a_saves]),
        "async_step_clear_s": clear,
        "async_step_overlapped_s": overlapped,
        "async_step_during_write_s": _stats(a_steps["during"]),
        "async_step_partial_s": _stats(a_steps["partial"]),
        "async_partial_covered": _stats(a_steps["partial_covered"]),
        "step_slowdown_overlapped": overlapped["median"] / clear["median"] if overlapped and clear else None,
        "step_slowdown_during_write": a_steps["during"]
        and clear
        and statistics.median(a_steps["during"]) / clear["median"]
        or None,
        "sync_step_s": _stats(s_steps["clear"]),
        "final_save_blocked_s": {
            "sync": sync["checkpoints"][-1]["blocked_s"],
            "async": asyn["checkpoints"][-1]["blocked_s"],
        },
        # all costs together: the time from the end of the warm-up to the last step (every periodic save in it)
        "train_s": {"sync": train_seconds(sync, warmup), "async": train_seconds(asyn, warmup)},
        "saved_per_save_s": (train_seconds(sync, warmup) - train_seconds(asyn, warmup)) / len(s_saves),
    }


def train_seconds(run: Dict[str, Any], warmup: int) -> float:
    times = {int(k): v for k, v in run["train_times"].items()}
    return times[run["last_step"]] - times[warmup]


# -- the plain-PyTorch reference --------------------------------------------------------------------------
def reference_worker(args: argparse.Namespace) -> None:
    """torch.save of the same model + optimizer state (after one step) to a new file, repeated; and a clone of it."""
    import torch

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = image_tinylm(IMAGE_SIZE, CLASSES, args.dim, args.layers)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=5e-4)  # trainer's defaults
    images, labels = torch.randn(args.batch, 3, IMAGE_SIZE, IMAGE_SIZE), torch.randint(0, CLASSES, (args.batch,))
    torch.nn.functional.cross_entropy(model(images), labels).backward()
    optimizer.step()
    state = {"model": model.state_dict(), "optim": optimizer.state_dict()}
    folder = Path(args.folder)
    folder.mkdir(parents=True, exist_ok=True)
    record: Dict[str, List[float]] = {"torch_save_s": [], "torch_save_fsync_s": [], "clone_s": []}
    for i in range(args.repeats):
        path = folder / f"ref-{i}.pt"
        start = time.perf_counter()
        torch.save(state, path)
        saved = time.perf_counter()
        fd = os.open(path, os.O_RDONLY)
        os.fsync(fd)
        os.close(fd)
        record["torch_save_s"].append(saved - start)
        record["torch_save_fsync_s"].append(time.perf_counter() - start)
        size = path.stat().st_size
        path.unlink()
        start = time.perf_counter()
        copy = (
            {k: v.clone() for k, v in model.state_dict().items()},
            {k: {n: t.clone() for n, t in s.items()} for k, s in optimizer.state.items()},
        )
        record["clone_s"].append(time.perf_counter() - start)
        del copy
    Path(args.out).write_text(
        json.dumps({**record, "bytes": size, "params": sum(p.numel() for p in model.parameters())})
    )


def reference(size: str, params: Dict[str, Any], folder: Path) -> Dict[str, Any]:
    out = folder / f"ref-{size}.json"
    model = SIZES[size]
    run_checked(
        [
            PYTHON,
            str(Path(__file__).resolve()),
            "--reference",
            f"--dim={model['dim']}",
            f"--layers={model['layers']}",
            f"--batch={params['batch'] // 2}",
            f"--repeats={params['ref_repeats']}",
            f"--folder={folder / 'ref'}",
            f"--out={out}",
        ],
        env=bench_env(),
        cwd=REPO,
        timeout=900,
    )
    raw = json.loads(out.read_text())
    return {
        "size": size,
        "params": raw["params"],
        "file_mb": raw["bytes"] / MB,
        **{k: stats(raw[k]) for k in ("torch_save_s", "torch_save_fsync_s", "clone_s")},
    }


# -- the driver ---------------------------------------------------------------------------------------------
def table(cases: List[Dict[str, Any]], refs: Dict[str, Dict[str, Any]]) -> List[str]:
    lines = [
        "| model | strategy | checkpoint | sync blocked s | async blocked s | async / sync | async write s | step "
        "s, no write | step s, write in flight | in flight / no write | torch.save s | torch.save + fsync s | "
        "clone s |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for c in cases:
        ref = refs.get(c["size"]) if c["strategy"] == "ddp" else None
        slow, ratio = c["step_slowdown_overlapped"], c["blocked_ratio"]
        covered = c["async_partial_covered"]
        inflight = fmt_stats(c["async_step_overlapped_s"])
        if c["async_step_overlapped_s"]:
            n_during = c["async_step_during_write_s"]["n"] if c["async_step_during_write_s"] else 0
            inflight += (
                f" [{n_during} whole, {c['async_step_overlapped_s']['n'] - n_during} part"
                + (f" ~{covered['median']:.0%}" if covered else "")
                + "]"
            )
        lines.append(
            f"| {c['size']} | {c['strategy']} | {c['checkpoint_mb']:.0f} MB | {fmt_stats(c['sync_blocked_s'])} | "
            f"{fmt_stats(c['async_blocked_s'])}"
            f" | {'-' if ratio is None else f'{ratio:.2f}'} | {fmt_stats(c['async_write_s'])} | "
            f"{fmt_stats(c['async_step_clear_s'])} | {inflight}"
            f" | {'-' if slow is None else f'{slow:.2f}'} | {fmt_stats(ref['torch_save_s']) if ref else '-'} | "
            f"{fmt_stats(ref['torch_save_fsync_s']) if ref else '-'}"
            f" | {fmt_stats(ref['clone_s']) if ref else '-'} |"
        )
    return lines


def summarise_runs(runs: List[Dict[str, Any]], params: Dict[str, Any]) -> List[Dict[str, Any]]:
    """One case per size x strategy, from its sync and async run, in the order they ran."""
    cases: Dict[Any, Dict[bool, Dict[str, Any]]] = {}
    for record in runs:
        cases.setdefault((record["size"], record["strategy"]), {})[record["async"]] = record
    return [summarise_case(pair[False], pair[True], params["every"], params["warmup"]) for pair in cases.values()]


def resummarise(path: Path) -> Dict[str, Any]:
    """No run: the figures and the table again from a result file's raw runs (after a change to the analysis)."""
    record = json.loads(path.read_text())
    record["cases"] = summarise_runs(record["runs"], record["params"])
    print("\n".join(table(record["cases"], record["references"])))
    path.write_text(json.dumps(record, indent=2, default=str) + "\n")
    print(f"rewrote {path}")
    return record


def run(quick: bool = False, **overrides: Any) -> Dict[str, Any]:
    params = {**(QUICK if quick else FULL), **overrides}
    info = machine_info(busy_seconds=1.0)
    started = time.perf_counter()
    runs, refs = [], {}
    with tempfile.TemporaryDirectory(prefix="async-ckpt-bench-") as tmp:
        for i, size in enumerate(params["sizes"]):
            for j, strategy in enumerate(params["strategies"]):
                order = (False, True) if (i + j) % 2 == 0 else (True, False)
                for async_save in order:
                    tag = f"{size}-{strategy}-{'async' if async_save else 'sync'}"
                    record = run_once(size, strategy, async_save, params, Path(tmp) / tag)
                    runs.append(record)
                    blocked = [c["blocked_s"] for c in record["checkpoints"]]
                    print(
                        f"  {tag:20s} {record['wall_s']:6.1f} s, blocked per save {[round(b, 2) for b in blocked]},"
                        f" other processes {record['foreign_cores']} cores, load {record['load_before']}",
                        flush=True,
                    )
            refs[size] = reference(size, params, Path(tmp))
            print(
                f"  {size} reference: torch.save {fmt_stats(refs[size]['torch_save_s'])} s, clone "
                f"{fmt_stats(refs[size]['clone_s'])} s",
                flush=True,
            )
    cases = summarise_runs(runs, params)
    record = {
        "params": params,
        "sizes": {s: SIZES[s] for s in params["sizes"]},
        "target": TARGET,
        "machine": info,
        "load_avg_after": load(),
        "wall_s": round(time.perf_counter() - started, 1),
        "cases": cases,
        "references": refs,
        "runs": runs,
    }
    print("\n".join(table(cases, refs)))
    path = write_result("async_checkpoint" + ("_quick" if quick else ""), record)
    print(f"{record['wall_s']:.0f} s; wrote {path}")
    return record


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a ~3 M-parameter model, 3 saves a run (about a minute)")
    parser.add_argument("--sizes", default="", help="comma-separated: 25M,100M (full mode's)")
    parser.add_argument(
        "--table",
        action="store_true",
        help="no run: figures and table again from results/async_checkpoint.json's raw runs",
    )
    parser.add_argument("--reference", action="store_true", help=argparse.SUPPRESS)
    for name in ("dim", "layers", "batch", "repeats"):
        parser.add_argument(f"--{name}", type=int, default=0, help=argparse.SUPPRESS)
    for name in ("folder", "out"):
        parser.add_argument(f"--{name}", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.reference:
        reference_worker(args)
        return
    if args.table:
        resummarise(RESULTS / ("async_checkpoint" + ("_quick" if args.quick else "") + ".json"))
        return
    run(quick=args.quick, **({"sizes": args.sizes.split(",")} if args.sizes else {}))


if __name__ == "__main__":
    main()
