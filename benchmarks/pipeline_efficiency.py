"""Pipeline efficiency on CPU: the pipelining engine (2 stages on 2 processes, 1 thread each)
against the bound built from measured parts, and against sequential model parallelism.

Every round, close in time:

1. pipeline_bound.py measures, in 2 processes on this machine (gloo, 1 thread each), each
   stage's forward and backward time at the micro-batch size (alone and with both cores busy),
   one activation transfer, and the step's work outside the schedule, and builds from them the
   GPipe and 1F1B step-time bounds for every M (see its docstring);
2. `hpc-train strategy=model_parallel` (both stages in one process) with 1 thread and with 2 threads;
3. `hpc-train strategy=pipeline strategy.engine=pipelining strategy.chunks=M` (2 processes,
   1 thread each) for every M, with the GPipe schedule and (full mode) 1F1B.

All runs get the same model, data, global batch, steps and the same explicit split (hpc-train's
balance=time split measured once at the start). Time per step = global batch / images/s (after
warm-up steps). Per round: efficiency = bound (both cores busy) / engine step time; speed-up =
sequential step time / engine step time. Figures: median (min-max) over rounds.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import List

sys.path.insert(0, str(Path(__file__).resolve().parent))
import pipeline_bound  # noqa: E402
from common import (
    PYTHON,
    clean_run,
    cpu_env,
    hpc_train_cmd,
    load,
    machine_info,
    read_json,
    row,
    run_checked,
    stats,
    write_result,
)  # noqa: E402

STAGES = 2
TARGET = 0.9
FULL = {"repeats": 3, "steps": 12, "warmup": 3, "probe_iters": 5, "schedules": ("gpipe", "1f1b")}
QUICK = {"repeats": 2, "steps": 6, "warmup": 2, "probe_iters": 3, "schedules": ("gpipe",)}


def time_balanced_split(model: str, image_size: int, batch: int) -> List[int]:
    """hpc-train's own balance=time split (partitioning.stage_counts: forward + backward time of each layer
    on a batch of `batch` images), measured once in a fresh 1-thread process.

    Every run then gets the same explicit split: with balance=time each run (and each rank of a
    pipelining run) would measure its own layer times and could cut elsewhere under load.
    """
    code = (
        "import json, torch, torchvision\n"
        "from hpc_train.compute.parallel.partitioning import flatten_layers, stage_counts\n"
        "torch.set_num_threads(1)\n"
        f"m = getattr(torchvision.models, {model!r})(weights=None, num_classes=10)\n"
        f"x = torch.randn({batch}, 3, {image_size}, {image_size})\n"
        f"print(json.dumps(stage_counts(flatten_layers(m), {STAGES}, 'time', x)))\n"
    )
    return json.loads(run_checked([PYTHON, "-c", code], env=cpu_env(1)).stdout.strip().splitlines()[-1])


def say(message: str) -> None:
    print(message, flush=True)


def _ideal(m: int) -> float:
    return m / (m + STAGES - 1) * STAGES


def measure(
    repeats: int,
    steps: int,
    warmup: int,
    probe_iters: int = 5,
    schedules=("gpipe", "1f1b"),
    model: str = "resnet18",
    image_size: int = 64,
    batch: int = 64,
    micro=(1, 2, 4, 8),
    balance: str = "time",
    split=None,
    split_points=None,
) -> dict:
    if split_points:  # cut at named modules (strategy.split_points), e.g. inside a residual block
        split = None
    elif split is None and not isinstance(balance, str):
        split = [int(x) for x in balance]
    elif (
        split is None and balance == "time"
    ):  # at the micro-batch size of the largest M, as the engine would cut for it
        split = time_balanced_split(model, image_size, batch // max(micro))
    common = [
        f"model={model}",
        "data=synthetic",
        f"data.image_size={image_size}",
        f"data.num_samples={max(1024, batch * steps)}",
        f"trainer.batch_size={batch}",
        f"trainer.max_steps={steps}",
        "trainer.epochs=null",
        "trainer.eval=false",
        "trainer.progress=false",
        f"trainer.throughput_warmup_steps={warmup}",
        f"strategy.stages={STAGES}",
        f"strategy.split_points=[{','.join(split_points)}]"
        if split_points
        else f"strategy.balance=[{','.join(map(str, split))}]"
        if split
        else f"strategy.balance={balance}",
        f"resources.gpus_per_node={STAGES}",
    ]
    cases = {"sequential": (["strategy=model_parallel"], 1), "sequential_2t": (["strategy=model_parallel"], 2)}
    for schedule in schedules:
        for m in micro:
            if schedule == "1f1b" and m < STAGES:
                continue  # Schedule1F1B needs chunks >= stages
            cases[f"{schedule} M={m}"] = (
                [
                    "strategy=pipeline",
                    "strategy.engine=pipelining",
                    f"strategy.chunks={m}",
                    f"strategy.schedule={schedule}",
                ],
                1,
            )
    times = {name: [] for name in cases}
    probes, loads, foreign = [], [], {}
    with tempfile.TemporaryDirectory(prefix="bench-pipe-") as tmp:
        for i in range(repeats):
            loads.append(load())
            # every measurement during which other processes used the CPUs is repeated (common.clean_run)
            probe, record = clean_run(
                lambda: pipeline_bound.measure(
                    model, image_size, batch, split, split_points, tuple(micro), probe_iters
                ),
                log=say,
            )
            probes.append(probe)
            foreign.setdefault("probe", []).append(record)
            for name, (overrides, threads) in cases.items():
                run_dir = Path(tmp) / f"{name.replace('=', '').replace(' ', '_')}-{i}"

                def one(overrides=overrides, threads=threads, run_dir=run_dir) -> float:
                    run_checked(hpc_train_cmd([*common, *overrides, f"hydra.run.dir={run_dir}"]), env=cpu_env(threads))
                    summary = read_json(run_dir / "summary.json")
                    return summary["global_batch"] / summary["images_per_sec"]  # seconds per step

                value, record = clean_run(one, log=say)
                times[name].append(value)
                foreign.setdefault(name, []).append(record)
        loads.append(load())
    seq, seq2 = times["sequential"], times["sequential_2t"]
    rows_out = []
    for schedule in schedules:
        for m in micro:
            name = f"{schedule} M={m}"
            if name not in times:
                continue
            t = times[name]
            together = [p["bounds"][m][f"{schedule}_together_s"] for p in probes]
            alone = [p["bounds"][m][f"{schedule}_alone_s"] for p in probes]
            rows_out.append(
                {
                    "schedule": schedule,
                    "micro_batches": m,
                    "micro_batch_size": batch // m,
                    "step_s": stats(t),
                    "bound_together_s": stats(together),
                    "bound_alone_s": stats(alone),
                    "efficiency": stats(
                        [b / x for b, x in zip(together, t)]
                    ),  # per round: bound and run of the same round
                    "efficiency_vs_alone_bound": stats([b / x for b, x in zip(alone, t)]),
                    "speedup": stats([r / x for r, x in zip(seq, t)]),
                    "speedup_vs_2_threads": stats([r / x for r, x in zip(seq2, t)]),
                    "bound_speedup": stats([r / b for r, b in zip(seq, together)]),
                    "ideal": _ideal(m),
                }
            )
    return {
        "config": {
            "model": model,
            "image_size": image_size,
            "batch": batch,
            "steps": steps,
            "warmup": warmup,
            "stages": STAGES,
            "balance": balance,
            "split_layers": split,
            "split_points": split_points,
            "threads_per_process": 1,
            "repeats": repeats,
            "probe_iters": probe_iters,
            "schedules": list(schedules),
        },
        "sequential": {"step_s": stats(seq)},
        "sequential_2_threads": {
            "step_s": stats(seq2),
            "speedup_over_1_thread": stats([a / b for a, b in zip(seq, seq2)]),
        },
        "rows": rows_out,
        "probes": probes,
        "load_before_rounds_and_after": loads,
        "foreign_cores": foreign,
    }


def table_rows(result: dict) -> list:
    if "skipped" in result:
        return [
            row("pipeline", "engine=pipelining", None, "sequential model_parallel", None, result["skipped"], "ms/step")
        ]
    ms = lambda s: {k: (v * 1000 if k in ("median", "min", "max") else v) for k, v in s.items()}  # noqa: E731
    c = result["config"]
    out = []
    s2 = result["sequential_2_threads"]
    sp2 = s2["speedup_over_1_thread"]
    out.append(
        row(
            "pipeline",
            f"sequential model_parallel, 1 proc x 2 threads ({c['image_size']} px, batch {c['batch']})",
            ms(s2["step_s"]),
            "same, 1 thread",
            ms(result["sequential"]["step_s"]),
            f"threads speed-up {sp2['median']:.2f} ({sp2['min']:.2f}-{sp2['max']:.2f})",
            "ms/step",
        )
    )
    for r in result["rows"]:
        e, sp = r["efficiency"], r["speedup"]
        out.append(
            row(
                "pipeline",
                f"engine=pipelining {r['schedule']}, 2 proc x 1 thread, M={r['micro_batches']}",
                ms(r["step_s"]),
                f"bound from measured stages + transfer ({r['schedule']})",
                ms(r["bound_together_s"]),
                f"efficiency {e['median']:.2f} ({e['min']:.2f}-{e['max']:.2f}); "
                f"{sp['median']:.2f}x sequential 1 thread, "
                f"{r['speedup_vs_2_threads']['median']:.2f}x 2 threads",
                "ms/step",
                f">= {TARGET}",
            )
        )
    return out


def run(
    quick: bool = False,
    repeats: int = 0,
    micro=(1, 2, 4, 8),
    balance: str = "time",
    image_size: int = 64,
    batch: int = 64,
    steps: int = 0,
    schedules=None,
    name: str = "pipeline_efficiency",
    warmup: int = 0,
    split_points=None,
) -> dict:
    params = dict(QUICK if quick else FULL)
    if repeats:
        params["repeats"] = repeats
    if steps:
        params["steps"] = steps
    if warmup:
        params["warmup"] = warmup
    if schedules:
        params["schedules"] = tuple(schedules)
    before = machine_info()
    start = time.perf_counter()
    result = measure(
        micro=tuple(micro), balance=balance, image_size=image_size, batch=batch, split_points=split_points, **params
    )
    result.update(
        benchmark="pipeline_efficiency",
        mode="quick" if quick else "full",
        machine=before,
        load_after=machine_info()["load_avg_1_5_15"],
        wall_s=time.perf_counter() - start,
    )
    result["table"] = table_rows(result)
    write_result(name, result)
    return result


def print_result(result: dict) -> None:
    seq, seq2 = result["sequential"]["step_s"], result["sequential_2_threads"]["step_s"]
    c = result["config"]
    print(
        f"{c['model']}, {c['image_size']} px, global batch {c['batch']}, split {c['split_layers']}, "
        f"{c['repeats']} rounds of {c['steps']} steps; "
        f"load before each round and after: {result['load_before_rounds_and_after']}"
    )
    print(
        f"sequential model-parallel: 1 thread {seq['median'] * 1000:.0f} ms/step "
        f"({seq['min'] * 1000:.0f}-{seq['max'] * 1000:.0f}), "
        f"2 threads {seq2['median'] * 1000:.0f} ms/step ({seq2['min'] * 1000:.0f}-{seq2['max'] * 1000:.0f})"
    )
    print("last round's measured parts:")
    pipeline_bound.print_table(result["probes"][-1])
    print(
        f"{'schedule':>8s} {'M':>3s} {'ms/step':>8s} {'bound ms':>9s} {'(alone)':>8s} {'efficiency':>18s} "
        f"{'speed-up vs seq 1t':>20s} {'vs seq 2t':>10s} {'bound speed-up':>15s} {'ideal':>6s}"
    )
    for r in result["rows"]:
        s, e, sp = r["step_s"], r["efficiency"], r["speedup"]
        print(
            f"{r['schedule']:>8s} {r['micro_batches']:3d} {s['median'] * 1000:8.0f} "
            f"{r['bound_together_s']['median'] * 1000:9.0f} {r['bound_alone_s']['median'] * 1000:8.0f} "
            f"{e['median']:6.2f} ({e['min']:.2f}-{e['max']:.2f}) {sp['median']:8.2f} "
            f"({sp['min']:.2f}-{sp['max']:.2f}) {r['speedup_vs_2_threads']['median']:10.2f} "
            f"{r['bound_speedup']['median']:15.2f} {r['ideal']:6.2f}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--repeats", type=int, default=0)
    parser.add_argument("--steps", type=int, default=0)
    parser.add_argument("--warmup", type=int, default=0)
    parser.add_argument("--micro", default="1,2,4,8")
    parser.add_argument("--schedules", default="", help="gpipe,1f1b (default: both in full mode, gpipe in quick mode)")
    parser.add_argument("--image-size", type=int, default=64)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument(
        "--balance",
        default="time",
        help="stage split for both sides: time (hpc-train's balance=time at the micro-batch size "
        "of the largest M), params, or layer counts a,b",
    )
    parser.add_argument(
        "--split-points", default="", help="cut at these modules instead (strategy.split_points), e.g. layer2.1.conv2"
    )
    parser.add_argument("--name", default="pipeline_efficiency", help="results/<name>.json")
    args = parser.parse_args()
    balance = [int(x) for x in args.balance.split(",")] if args.balance[0].isdigit() else args.balance
    result = run(
        args.quick,
        args.repeats,
        [int(x) for x in args.micro.split(",")],
        balance,
        args.image_size,
        args.batch,
        args.steps,
        [s for s in args.schedules.split(",") if s],
        args.name,
        args.warmup,
        [p for p in args.split_points.split(",") if p] or None,
    )
    print_result(result)


if __name__ == "__main__":
    main()
