"""Gradient accumulation under DDP on CPU: what `no_sync` saves, and whether hpc-train saves it.

Three sides, each a fresh 2-rank gloo job (1 intra-op thread a rank), same model, data, global
batch and accumulation (`--accum`, default 4 micro-batches per optimizer step):

* hpc-train: `hpc-train strategy=ddp resources.gpus_per_node=2 trainer.grad_accum_steps=4
  model=toy_mlp model.hidden=H data=synthetic ...` (the real command line; its local launcher
  starts the 2 workers). DDP runs all micro-batches but the last under `model.no_sync()`;
* plain DDP, accumulation WITHOUT no_sync: this script with `--worker --mode sync` under
  `torchrun --standalone --nproc-per-node 2`: the hand-written loop that calls backward on each
  micro-batch of a DistributedDataParallel model, so DDP all-reduces the gradients after every
  micro-batch (what accumulation costs without `no_sync`);
* plain DDP WITH no_sync: the same loop with `--mode no_sync` (the first micro-batches under
  `model.no_sync()`, all-reduce after the last only): the like-for-like reference for hpc-train.

Model: hpc-train's `toy_mlp` (Flatten, Linear(3 x S x S -> H), ReLU, Linear(H -> 10)); the plain
loop builds the same layers. Default S = 32, H = 1024: 3.16 M parameters, 12.6 MB of fp32
gradients, large enough that the gradient all-reduce is a visible share of a step on CPU. Data:
hpc-train's `data=synthetic` tensors (`torch.randn`/`torch.randint` from a generator seeded with
1), one epoch exactly, each rank reading its share through a DistributedSampler'd DataLoader
(num_workers=0); each rank's batch is cut into `--accum` equal micro-batches, each micro-batch's
loss weighted by its share. SGD (momentum 0.9, weight decay 5e-4), cosine schedule,
cross-entropy, fp32.

Counting and timing: benchmarks/accumprobe/ is put first on PYTHONPATH for every side (its
sitecustomize: no change to hpc-train or to the plain loop). In every run it records the end of
each optimizer step (a global optimizer step post hook, ~1 us). In the counting runs (one run of
each side, before the timed rounds) it also registers a DDP communication hook on every
DistributedDataParallel when it is built: torch's `default_hooks.allreduce_hook` wrapped to count
each call, i.e. each gradient bucket DDP all-reduces (DDP does not call it inside `no_sync()`),
and it counts Python's `torch.distributed.all_reduce` calls (other all-reduces = their number
minus the buckets'). The timed rounds run without the hook, on DDP's own all-reduce path. Per
run: the step time is the median, over the steps after `warmup`, of rank 0's intervals between
the ends of consecutive optimizer steps; the counts per step are taken over the same steps on
every rank. hpc-train's `summary.json` (`samples_per_sec`) and the plain loop's own window figure
(same definition) are recorded beside it.

Runs come in rounds of one run of each side, the order going through every rotation of the sides,
forwards then backwards (for 3 sides: all 6 orders); figures are the median over rounds with
their min-max, and the ratios are paired per round. `--clean` repeats a round during which other
processes used more than 0.1 cores (`common.clean_run`).

`--control-side` adds a diagnostic 4th side: the no_sync loop plus, after every optimizer step,
one 8-byte MAX all-reduce on a second gloo group, which is what hpc-train does after every step
(its ranks agree on a stop request, `StopFlag.agreed`): it tells how much of hpc-train's step
time above the plain no_sync loop that collective explains.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (
    HERE,
    PYTHON,
    clean_run,
    cpu_env,
    foreign_cpu,
    hpc_train_cmd,
    load,
    machine_info,
    paired_ratios,
    read_json,
    run_checked,
    stats,
    write_result,
)  # noqa: E402
from grad_accum_tables import CONTROL, SIDES, print_table, rows  # noqa: E402

PROBE = HERE / "accumprobe"
FULL = {"repeats": 6, "steps": 30, "warmup": 5}
QUICK = {"repeats": 3, "steps": 16, "warmup": 4}
MODEL = {"image_size": 32, "hidden": 1024, "batch": 128, "accum": 4, "world": 2}


# -- the plain loop (one rank, under torchrun) ----------------------------------------------
def worker(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist
    import torch.nn as nn

    torch.set_num_threads(args.threads)
    dist.init_process_group("gloo")
    world, rank = dist.get_world_size(), dist.get_rank()
    per_rank = args.batch // world
    torch.manual_seed(args.seed)
    in_features = 3 * args.image_size * args.image_size
    model = nn.Sequential(
        nn.Flatten(), nn.Linear(in_features, args.hidden), nn.ReLU(), nn.Linear(args.hidden, args.num_classes)
    )
    model = nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9, weight_decay=5e-4)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=args.steps)
    loss_fn = nn.CrossEntropyLoss()
    gen = torch.Generator().manual_seed(1)
    images = torch.randn(args.num_samples, 3, args.image_size, args.image_size, generator=gen)
    labels = torch.randint(0, args.num_classes, (args.num_samples,), generator=gen)
    dataset = torch.utils.data.TensorDataset(images, labels)
    sampler = torch.utils.data.DistributedSampler(dataset, shuffle=True, seed=args.seed, drop_last=True)
    loader = torch.utils.data.DataLoader(dataset, batch_size=per_rank, sampler=sampler, drop_last=True)
    control = (
        dist.new_group(backend="gloo") if args.control_all_reduce else None
    )  # diagnostic: hpc-train's per-step stop-signal agreement

    warmup = min(args.warmup, args.steps - 1)
    step, epoch, start, last_loss = 0, 0, None, None
    model.train()
    while step < args.steps:
        sampler.set_epoch(epoch)
        for x, y in loader:
            optimizer.zero_grad(set_to_none=True)
            micro = list(zip(x.chunk(args.accum), y.chunk(args.accum)))
            loss_sum = 0.0
            for i, (xm, ym) in enumerate(micro):
                skip_sync = args.mode == "no_sync" and i < len(micro) - 1
                with model.no_sync() if skip_sync else contextlib.nullcontext():
                    loss = loss_fn(model(xm), ym) * (len(xm) / len(x))
                    loss.backward()
                loss_sum = loss_sum + loss.detach()
            optimizer.step()
            scheduler.step()
            step += 1
            if control is not None:  # what hpc-train does after every step: the ranks agree on a stop request
                flag = torch.tensor([0], dtype=torch.int64)
                dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=control)
                int(flag.item())
            if step % args.log_every == 0 or step == args.steps:
                last_loss = float(loss_sum)
            if step == warmup:
                start = time.perf_counter()
            if step >= args.steps:
                break
        epoch += 1
    seconds = time.perf_counter() - start
    dist.destroy_process_group()
    if rank == 0 and args.out:
        Path(args.out).write_text(
            json.dumps(
                {
                    "samples_per_sec": (args.steps - warmup) * args.batch / seconds,
                    "timed_steps": args.steps - warmup,
                    "train_loss": last_loss,
                    "mode": args.mode,
                    "world_size": world,
                    "threads": torch.get_num_threads(),
                    "args": vars(args),
                },
                indent=2,
            )
        )


# -- reading the probe ------------------------------------------------------------------
def probe_records(probe_dir: Path, world: int) -> list:
    files = sorted(Path(probe_dir).glob("accum-rank*.json"))
    records = sorted((json.loads(f.read_text()) for f in files), key=lambda r: r["rank"])
    if [r["rank"] for r in records] != list(range(world)):
        raise RuntimeError(
            f"expected one probed training process per rank 0..{world - 1}, found {[f.name for f in files]} in "
            f"{probe_dir}"
        )
    return records


def per_step(cumulative: list) -> list:
    """Counts per optimizer step from the running counts recorded at the end of each step."""
    return [b - a for a, b in zip([0, *cumulative[:-1]], cumulative)]


def analyse(records: list, steps: int, warmup: int) -> dict:
    """Step time (rank 0) and all-reduce counts per step (every rank) over the steps after `warmup`."""
    for r in records:
        if len(r["opt_end"]) != steps:
            raise RuntimeError(f"rank {r['rank']} took {len(r['opt_end'])} optimizer steps, expected {steps}")
    ends = records[0]["opt_end"]
    intervals = [b - a for a, b in zip(ends[warmup - 1 :], ends[warmup:])]
    out = {
        "median_step_ms": 1e3 * statistics.median(intervals),
        "window_step_ms": 1e3 * (ends[-1] - ends[warmup - 1]) / (steps - warmup),
        "step_ms_rank0": [round(1e3 * x, 3) for x in intervals],
        "torch_threads_rank0": records[0].get("threads"),
    }
    if records[0]["counting"]:
        buckets = [c for r in records for c in per_step(r["bucket_calls"])[warmup:]]
        nbytes = [c for r in records for c in per_step(r["bucket_bytes"])[warmup:]]
        others = [
            a - b
            for r in records
            for a, b in zip(per_step(r["all_reduce_calls"])[warmup:], per_step(r["bucket_calls"])[warmup:])
        ]
        out |= {
            "ddp_models_hooked": [r["ddp_hooked"] for r in records],
            "grad_all_reduces_per_step": {
                "median": statistics.median(buckets),
                "min": min(buckets),
                "max": max(buckets),
            },
            "grad_mb_per_step": {
                "median": statistics.median(nbytes) / 1e6,
                "min": min(nbytes) / 1e6,
                "max": max(nbytes) / 1e6,
            },
            "other_all_reduces_per_step": {"mean": statistics.mean(others), "min": min(others), "max": max(others)},
            "grad_all_reduces_every_step_rank0": per_step(records[0]["bucket_calls"]),  # warm-up steps included
            "other_all_reduces_every_step_rank0": [
                a - b for a, b in zip(per_step(records[0]["all_reduce_calls"]), per_step(records[0]["bucket_calls"]))
            ],
        }
    return out


# -- the benchmark ------------------------------------------------------------------------
def measure(
    repeats: int,
    steps: int,
    warmup: int,
    image_size: int,
    hidden: int,
    batch: int,
    accum: int,
    world: int,
    count: bool = True,
    clean: bool = False,
    hook_in_timing: bool = False,
    control_side: bool = False,
) -> dict:
    used = SIDES + ((CONTROL,) if control_side else ())
    env = cpu_env(1)  # 1 intra-op thread a rank (hpc-train's local launcher would pick cpus // world = 1 on 2 cores)
    samples = batch * steps  # one epoch: no epoch boundary inside the window
    runs = {side: [] for side in used}
    rounds = []
    with tempfile.TemporaryDirectory(prefix="bench-accum-") as tmp:
        serial = itertools.count()  # a repeated round (clean_run) gets fresh run and probe directories

        def probed(name: str, counting: bool) -> tuple:
            probe_dir = Path(tmp) / f"probe-{name}"
            probe_dir.mkdir()
            return env | {
                "PYTHONPATH": str(PROBE),
                "HPC_BENCH_ACCUMPROBE_DIR": str(probe_dir),
                "HPC_BENCH_ACCUMPROBE_HOOK": "1" if counting else "0",
            }, probe_dir

        def run_hpc(name: str, counting: bool) -> dict:
            run_dir = Path(tmp) / name
            run_env, probe_dir = probed(name, counting)
            run_checked(
                hpc_train_cmd(
                    [
                        "strategy=ddp",
                        f"resources.gpus_per_node={world}",
                        f"trainer.grad_accum_steps={accum}",
                        "model=toy_mlp",
                        f"model.hidden={hidden}",
                        "data=synthetic",
                        f"data.image_size={image_size}",
                        f"data.num_samples={samples}",
                        f"trainer.batch_size={batch}",
                        f"trainer.max_steps={steps}",
                        "trainer.epochs=null",
                        "trainer.eval=false",
                        f"trainer.throughput_warmup_steps={warmup}",
                        f"hydra.run.dir={run_dir}",
                    ]
                ),
                env=run_env,
            )
            summary = read_json(run_dir / "summary.json")
            result = analyse(probe_records(probe_dir, world), steps, warmup)
            result |= {
                "summary_samples_per_sec": summary["samples_per_sec"],
                "summary_step_ms": 1e3 * batch / summary["samples_per_sec"],
                "summary_timed_steps": summary.get("timed_steps"),
            }
            return result

        def run_plain(mode: str, name: str, counting: bool, *extra: str) -> dict:
            out = Path(tmp) / f"{name}.json"
            run_env, probe_dir = probed(name, counting)
            run_checked(
                [
                    PYTHON,
                    "-m",
                    "torch.distributed.run",
                    "--standalone",
                    f"--nproc-per-node={world}",
                    str(Path(__file__).resolve()),
                    "--worker",
                    f"--mode={mode}",
                    f"--image-size={image_size}",
                    f"--hidden={hidden}",
                    f"--num-samples={samples}",
                    f"--batch={batch}",
                    f"--accum={accum}",
                    f"--steps={steps}",
                    f"--warmup={warmup}",
                    "--threads=1",
                    f"--out={out}",
                    *extra,
                ],
                env=run_env,
            )
            plain = read_json(out)
            result = analyse(probe_records(probe_dir, world), steps, warmup)
            result |= {
                "summary_samples_per_sec": plain["samples_per_sec"],
                "summary_step_ms": 1e3 * batch / plain["samples_per_sec"],
            }
            return result

        sides = {
            "hpc": lambda name, counting: run_hpc(name, counting),
            "plain_sync": lambda name, counting: run_plain("sync", name, counting),
            "plain_nosync": lambda name, counting: run_plain("no_sync", name, counting),
            CONTROL: lambda name, counting: run_plain("no_sync", name, counting, "--control-all-reduce"),
        }
        counted = {}
        if count:  # one counting run of each side (comm hook on), kept apart from the timed rounds (hook off)
            for side in used:
                counted[side] = sides[side](f"count-{side}", True)
            print(
                "  counting runs: "
                + ", ".join(
                    f"{side} {counted[side]['grad_all_reduces_per_step']['median']:g} gradient all-reduces/step "
                    f"({counted[side]['median_step_ms']:.1f} ms/step with the hook)"
                    for side in used
                ),
                flush=True,
            )
        # every rotation of the sides, forwards and backwards (for 3 sides: all 6 orders)
        orders = [used[k:] + used[:k] for k in range(len(used))]
        orders += [tuple(reversed(o)) for o in orders]
        for i in range(repeats):
            order = orders[i % len(orders)]
            t0 = time.perf_counter()
            before = load()

            def do_round(i=i, order=order):
                return [sides[side](f"{side}{i}-{next(serial)}", hook_in_timing) for side in order]

            if clean:  # repeated while other processes used the CPUs (common.clean_run)
                values, record = clean_run(do_round, log=lambda msg: print(msg, flush=True))
            else:
                values, foreign = foreign_cpu(do_round)
                record = {"foreign_cores": [foreign], "clean": None}
            for side, value in zip(order, values):
                runs[side].append(value)
            rounds.append(
                {"order": list(order), "load_before": before, "wall_s": round(time.perf_counter() - t0, 1)} | record
            )
            print(
                f"  round {i + 1}/{repeats} ({', '.join(order)}): "
                + ", ".join(f"{side} {v['median_step_ms']:.1f} ms" for side, v in zip(order, values))
                + f"; other processes {record['foreign_cores'][-1]} cores",
                flush=True,
            )

    step = {side: [r["median_step_ms"] for r in runs[side]] for side in used}
    result = {
        "config": {
            "model": "toy_mlp",
            "image_size": image_size,
            "hidden": hidden,
            "parameters": 3 * image_size * image_size * hidden + hidden + hidden * 10 + 10,
            "global_batch": batch,
            "grad_accum_steps": accum,
            "world_size": world,
            "micro_batch_per_rank": batch // world // accum,
            "steps": steps,
            "warmup": warmup,
            "repeats": repeats,
            "threads_per_rank": 1,
            "backend": "gloo",
            "precision": "32",
            "counting": count,
            "clean_rounds": clean,
            "hook_in_timed_rounds": hook_in_timing,
            "sides": list(used),
        },
        "median_step_ms": {side: stats(step[side]) for side in used},
        "window_step_ms": {side: stats([r["window_step_ms"] for r in runs[side]]) for side in used},
        "summary_step_ms": {side: stats([r["summary_step_ms"] for r in runs[side]]) for side in used},
        "ratio_sync_over_nosync": stats(paired_ratios(step["plain_sync"], step["plain_nosync"])),
        "ratio_sync_over_hpc": stats(paired_ratios(step["plain_sync"], step["hpc"])),
        "ratio_hpc_over_nosync": stats(paired_ratios(step["hpc"], step["plain_nosync"])),
        "runs": runs,
        "rounds": rounds,
    }
    if control_side:
        result["ratio_control_over_nosync"] = stats(paired_ratios(step[CONTROL], step["plain_nosync"]))
        result["ratio_hpc_over_control"] = stats(paired_ratios(step["hpc"], step[CONTROL]))
    if count:
        result["counting_runs"] = counted
        result["grad_all_reduces_per_step"] = {side: counted[side]["grad_all_reduces_per_step"] for side in used}
        result["grad_mb_per_step"] = {side: counted[side]["grad_mb_per_step"] for side in used}
        result["other_all_reduces_per_step"] = {side: counted[side]["other_all_reduces_per_step"] for side in used}
        hpc, ref = result["grad_all_reduces_per_step"]["hpc"], result["grad_all_reduces_per_step"]["plain_nosync"]
        result["hpc_count_equals_no_sync_loop"] = hpc == ref and hpc["min"] == hpc["max"]
    return result


def run(
    quick: bool = False,
    repeats: int = 0,
    steps: int = 0,
    count: bool = True,
    clean: bool = False,
    hook_in_timing: bool = False,
    control_side: bool = False,
    name: str = "grad_accum",
    **model,
) -> dict:
    params = dict(QUICK if quick else FULL)
    if repeats:
        params["repeats"] = repeats
    if steps:
        params["steps"] = steps
    before = machine_info(busy_seconds=1.0)
    start = time.perf_counter()
    result = measure(
        count=count, clean=clean, hook_in_timing=hook_in_timing, control_side=control_side, **params, **(MODEL | model)
    )
    result.update(
        benchmark="grad_accum",
        mode="quick" if quick else "full",
        machine=before,
        load_after=machine_info()["load_avg_1_5_15"],
        wall_s=time.perf_counter() - start,
    )
    result["table"] = rows(result)
    write_result(name, result)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--quick",
        action="store_true",
        help=f"{QUICK['repeats']} rounds x {QUICK['steps']} steps (default {FULL['repeats']} x {FULL['steps']})",
    )
    parser.add_argument("--repeats", type=int, default=0, help="rounds (one run of each side per round)")
    parser.add_argument("--steps", type=int, default=0)
    parser.add_argument(
        "--hidden", type=int, default=MODEL["hidden"], help="toy_mlp hidden width (parameters ~ 3 x S^2 x hidden)"
    )
    parser.add_argument("--image-size", type=int, default=MODEL["image_size"])
    parser.add_argument("--batch", type=int, default=MODEL["batch"], help="global batch per optimizer step")
    parser.add_argument("--accum", type=int, default=MODEL["accum"], help="micro-batches per optimizer step")
    parser.add_argument(
        "--no-count",
        action="store_true",
        help="timed rounds only: skip the counting runs (comm hook on) that come first",
    )
    parser.add_argument(
        "--hook-in-timing",
        action="store_true",
        help="the timed rounds run with the counting comm hook too (to measure what the hook costs)",
    )
    parser.add_argument(
        "--control-side",
        action="store_true",
        help=(
            "a 4th side: the no_sync loop plus an 8-byte all-reduce on a second gloo group after every step (what "
            "hpc-train does to agree on stop signals)"
        ),
    )
    parser.add_argument(
        "--clean",
        action="store_true",
        help="repeat a round while other processes use more than 0.1 cores (common.clean_run)",
    )
    parser.add_argument("--name", default="grad_accum", help="result file benchmarks/results/<name>.json")
    # the plain loop, one rank (started by torchrun from measure())
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--mode", choices=["sync", "no_sync"], default="no_sync", help=argparse.SUPPRESS)
    parser.add_argument("--num-samples", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--num-classes", type=int, default=10, help=argparse.SUPPRESS)
    parser.add_argument("--warmup", type=int, default=5, help=argparse.SUPPRESS)
    parser.add_argument("--threads", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--lr", type=float, default=0.05, help=argparse.SUPPRESS)
    parser.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--log-every", type=int, default=10, help=argparse.SUPPRESS)
    parser.add_argument("--out", default="", help=argparse.SUPPRESS)
    parser.add_argument("--control-all-reduce", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return
    name = args.name
    result = run(
        args.quick,
        args.repeats,
        args.steps,
        count=not args.no_count,
        clean=args.clean,
        hook_in_timing=args.hook_in_timing,
        control_side=args.control_side,
        name=name,
        image_size=args.image_size,
        hidden=args.hidden,
        batch=args.batch,
        accum=args.accum,
    )
    print()
    print_table(result)
    print(f"\n{result['wall_s']:.0f} s; results/{name}.json")


if __name__ == "__main__":
    main()
