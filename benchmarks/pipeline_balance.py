"""Does `balance=time` choose a good 2-stage split? Its choice against every split, measured.

Each run, in fresh processes (1 intra-op thread each, run one after the other, never two at once):

1. **choice**: hpc-train's `balance=time` split (`partitioning.stage_counts`, forward + backward time of
   each layer at the micro-batch size), measured as the first work of a fresh process, exactly as
   `pipeline_efficiency.py` and a job's start measure it (with `--legacy`, also the timing hpc-train
   used before it timed in rounds, in its own fresh process);
2. **truth**: every 2-stage split k (stage 0 = the first k layers), each stage run as the pipeline
   runs it on one micro-batch: stage 0 forward and backward (from ones), stage 1 forward on stage 0's
   activation, cross-entropy loss and backward. One untimed warm-up round, then `--rounds` rounds
   over all splits (round-robin, so that a burst of other load slows every split once, not one split
   every time); median per stage. A split's cost is its slower stage.

Per run: the chosen split's slower-stage time relative to the best split's (1.00: it chose the best;
the target is <= 1.10). Runs during which other processes used more than 0.1 core are repeated
(`common.clean_run`; `--max-foreign` raises that limit on a machine shared with other work; every
record keeps the foreign cores measured). Stages run alone on one core here; inside a pipeline both
cores are busy, which slows both stages a little (pipeline_bound.py's `together`), not their order.

    python benchmarks/pipeline_balance.py --image-size 128 --micro-batch 16 --runs 5 --legacy
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Dict, List

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import FOREIGN_MAX, PYTHON, clean_run, cpu_env, machine_info, run_checked, write_result  # noqa: E402

TARGET = 1.10


def legacy_layer_times(layers, example, repeats: int = 3) -> List[float]:
    """hpc-train's layer timing before the fix (the old stages.layer_times, now parallel/partitioning.py), kept to
    show the difference.

    Each layer alone, `repeats` back-to-back runs (the first ones included), median.
    """
    import torch

    times, x = [], example
    for index, layer in enumerate(layers):
        probe, runs = copy.deepcopy(layer), []
        for _ in range(repeats):
            leaf = x.detach().requires_grad_(index > 0 and x.is_floating_point())
            start = time.perf_counter()
            y = probe(leaf.clone())
            if isinstance(y, torch.Tensor) and y.requires_grad:
                y.backward(torch.ones_like(y))
            runs.append(time.perf_counter() - start)
        times.append(sorted(runs)[len(runs) // 2] + 1e-9)
        x = y.detach()
    return times


def _model_and_batch(args: argparse.Namespace):
    import torch
    import torchvision

    from hpc_train.compute.parallel.partitioning import flatten_layers

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = getattr(torchvision.models, args.model)(weights=None, num_classes=10)
    return model, flatten_layers(model), torch.randn(args.micro_batch, 3, args.image_size, args.image_size)


def _choice_worker(args: argparse.Namespace) -> dict:
    """The split balance=time chooses, measured first thing in this fresh process."""
    from hpc_train.compute.parallel.partitioning import layer_times, partition

    _, layers, x = _model_and_batch(args)
    start = time.perf_counter()
    weights = legacy_layer_times(layers, x) if args.method == "legacy" else layer_times(layers, x)
    return {
        "method": args.method,
        "split": partition(weights, 2),
        "layer_ms": [round(w * 1000, 2) for w in weights],
        "timing_s": time.perf_counter() - start,
    }


def _truth_worker(args: argparse.Namespace) -> dict:
    """Forward + backward time of both stages of every 2-stage split, as the pipeline runs them."""
    import torch

    _, layers, x = _model_and_batch(args)
    labels = torch.randint(0, 10, (x.shape[0],))
    loss_fn = torch.nn.CrossEntropyLoss()
    n = len(layers)
    splits = list(range(1, n))
    acts = {}
    with torch.no_grad():
        carry = x
        for k in range(1, n):
            carry = layers[k - 1](carry)
            acts[k] = carry.detach().clone()
    first = {k: torch.nn.Sequential(*layers[:k]) for k in splits}
    last = {k: torch.nn.Sequential(*layers[k:]) for k in splits}

    def stage0(k: int) -> float:
        start = time.perf_counter()
        out = first[k](x)
        out.backward(torch.ones_like(out))
        seconds = time.perf_counter() - start
        first[k].zero_grad(set_to_none=True)
        return seconds

    def stage1(k: int) -> float:
        inp = acts[k].clone().requires_grad_().clone()  # a non-leaf: a stage may begin with an in-place ReLU
        start = time.perf_counter()
        loss_fn(last[k](inp), labels).backward()
        seconds = time.perf_counter() - start
        last[k].zero_grad(set_to_none=True)
        return seconds

    runs: Dict[int, List[List[float]]] = {k: [[], []] for k in splits}
    for round_index in range(1 + args.rounds):  # round 0: warm-up
        for k in splits:
            a, b = stage0(k), stage1(k)
            if round_index:
                runs[k][0].append(a)
                runs[k][1].append(b)
    return {str(k): [statistics.median(r[0]), statistics.median(r[1])] for k, r in runs.items()}


def _spawn(args: argparse.Namespace, worker: str, method: str = "new") -> dict:
    cmd = [PYTHON, str(Path(__file__).resolve()), f"--worker={worker}", f"--method={method}", f"--model={args.model}"]
    cmd += [f"--image-size={args.image_size}", f"--micro-batch={args.micro_batch}", f"--rounds={args.rounds}"]
    return json.loads(run_checked(cmd, env=cpu_env(1)).stdout.strip().splitlines()[-1])


def one_run(args: argparse.Namespace, log) -> dict:
    """A run: the choice (and the legacy choice) in fresh processes, then every split's stage times."""
    record: dict = {"foreign_cores": {}}
    methods = ["new", "legacy"] if args.legacy else ["new"]
    for method in methods:
        record[method], record["foreign_cores"][method] = clean_run(
            lambda method=method: _spawn(args, "choice", method), args.max_foreign, log=log
        )
    truth, record["foreign_cores"]["truth"] = clean_run(lambda: _spawn(args, "truth"), args.max_foreign, log=log)
    cost = {int(k): max(v) for k, v in truth.items()}
    best = min(cost, key=cost.get)
    record["stage_ms"] = {int(k): [round(t * 1000, 1) for t in v] for k, v in truth.items()}
    record["best"] = [best, len(cost) + 1 - best]
    record["best_ms"] = cost[best] * 1000
    for method in methods:
        k = record[method]["split"][0]
        record[method]["max_stage_ms"] = cost[k] * 1000
        record[method]["relative"] = cost[k] / cost[best]
    return record


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--worker", default="", help=argparse.SUPPRESS)
    parser.add_argument("--method", default="new", help=argparse.SUPPRESS)
    parser.add_argument("--model", default="resnet18")
    parser.add_argument("--image-size", type=int, default=128)
    parser.add_argument(
        "--micro-batch", type=int, default=16, help="images per micro-batch (pipeline_efficiency: batch / M)"
    )
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=3, help="timed rounds over all splits per run")
    parser.add_argument("--legacy", action="store_true", help="also the pre-fix timing, in its own fresh process")
    parser.add_argument(
        "--max-foreign",
        type=float,
        default=FOREIGN_MAX,
        help="repeat a measurement during which other processes used more cores than this",
    )
    parser.add_argument("--name", default="pipeline_balance", help="results/<name>.json")
    args = parser.parse_args()
    if args.worker:
        worker = {"choice": _choice_worker, "truth": _truth_worker}[args.worker]
        print(json.dumps(worker(args)))
        return

    def say(message: str) -> None:
        print(message, flush=True)

    before = machine_info()
    records = []
    for i in range(args.runs):
        record = one_run(args, say)
        records.append(record)
        near = {k: v for k, v in record["stage_ms"].items() if abs(k - record["best"][0]) <= 2}
        line = f"run {i + 1}: best {record['best']} {record['best_ms']:.0f} ms"
        for method in ("new", "legacy"):
            if method in record:
                r = record[method]
                line += f" | {method}: {r['split']} {r['max_stage_ms']:.0f} ms = {r['relative']:.2f}x best"
        kept = [f["foreign_cores"][-1] for f in record["foreign_cores"].values()]  # the kept try of each part
        line += f" | other processes <= {max((c for c in kept if c is not None), default=float('nan')):.2f} cores"
        say(
            line
            + "  (stage 0 / 1 ms near the best: "
            + ", ".join(f"{k}: {a:.0f}/{b:.0f}" for k, (a, b) in near.items())
            + ")"
        )
    within = {m: sum(r[m]["relative"] <= TARGET for r in records) for m in ("new", "legacy") if m in records[0]}
    summary = ", ".join(f"{m}: {n} of {len(records)} within {TARGET:.2f}x of the best" for m, n in within.items())
    say(summary)
    write_result(
        args.name,
        {
            "benchmark": "pipeline_balance",
            "config": {
                k: getattr(args, k)
                for k in ("model", "image_size", "micro_batch", "runs", "rounds", "legacy", "max_foreign")
            },
            "machine": before,
            "load_after": machine_info()["load_avg_1_5_15"],
            "runs": records,
            "within_target": within,
            "target": TARGET,
        },
    )


if __name__ == "__main__":
    main()
