"""Pipeline efficiency on CPU: the pipelining engine (2 stages on 2 processes, 1 thread each)
against the same 2-stage model run sequentially in one process (model_parallel, 1 thread),
for 1/2/4/8 micro-batches, next to the fill-drain ideal M/(M+S-1) x S.

Both sides run through `hpc-train` with identical model, data, batch and steps; the figure is
the median time per step over `--repeats` runs (images/s measured after warm-up steps). Runs
alternate (sequential, M=1, M=2, ..., then again), so a slow drift of the machine hits all rows.
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
from common import PYTHON, cpu_env, hpc_train_cmd, machine_info, read_json, row, run_checked, stats, write_result  # noqa: E402

STAGES = 2
FULL = {"repeats": 3, "steps": 12, "warmup": 3}
QUICK = {"repeats": 2, "steps": 6, "warmup": 2}


def time_balanced_split(model: str, image_size: int, batch: int) -> List[int]:
    """hpc-train's own balance=time split (stages.stage_counts), measured once in a fresh 1-thread process.

    Every run then gets the same explicit split: with balance=time each run (and each rank of a
    pipelining run) would measure its own layer times and could cut elsewhere under load.
    """
    code = (
        "import json, torch, torchvision\n"
        "from hpc_train.compute.stages import flatten_layers, stage_counts\n"
        "torch.set_num_threads(1)\n"
        f"m = getattr(torchvision.models, {model!r})(weights=None, num_classes=10)\n"
        f"x = torch.randn({batch}, 3, {image_size}, {image_size})\n"
        f"print(json.dumps(stage_counts(flatten_layers(m), {STAGES}, 'time', x)))\n"
    )
    return json.loads(run_checked([PYTHON, "-c", code], env=cpu_env(1)).stdout.strip().splitlines()[-1])


def measure(repeats: int, steps: int, warmup: int, model: str = "resnet18", image_size: int = 64, batch: int = 64, micro=(1, 2, 4, 8), balance: str = "time") -> dict:
    split = time_balanced_split(model, image_size, batch) if balance == "time" else None
    common = [
        f"model={model}", "data=synthetic", f"data.image_size={image_size}", f"data.num_samples={max(1024, batch * steps)}",
        f"trainer.batch_size={batch}", f"trainer.max_steps={steps}", "trainer.epochs=null", "trainer.eval=false",
        "trainer.progress=false", f"trainer.throughput_warmup_steps={warmup}", f"strategy.stages={STAGES}",
        f"strategy.balance=[{','.join(map(str, split))}]" if split else f"strategy.balance={balance}",
        f"resources.gpus_per_node={STAGES}",
    ]
    cases = {"sequential": ["strategy=model_parallel"]}
    for m in micro:
        cases[f"M={m}"] = ["strategy=pipeline", "strategy.engine=pipelining", f"strategy.chunks={m}"]
    times = {name: [] for name in cases}
    env = cpu_env(1)
    with tempfile.TemporaryDirectory(prefix="bench-pipe-") as tmp:
        for i in range(repeats):
            for name, overrides in cases.items():
                run_dir = Path(tmp) / f"{name.replace('=', '')}-{i}"
                run_checked(hpc_train_cmd([*common, *overrides, f"hydra.run.dir={run_dir}"]), env=env)
                summary = read_json(run_dir / "summary.json")
                times[name].append(summary["global_batch"] / summary["images_per_sec"])  # seconds per step
    ref = times["sequential"]
    rows_out = []
    for m in micro:
        t = times[f"M={m}"]
        rows_out.append({
            "micro_batches": m,
            "step_s": stats(t),
            "speedup": stats([r / x for r, x in zip(ref, t)]),  # paired with the sequential run of the same round
            "ideal": m / (m + STAGES - 1) * STAGES,
        })
    return {
        "config": {"model": model, "image_size": image_size, "batch": batch, "steps": steps, "warmup": warmup, "stages": STAGES, "balance": balance, "split_layers": split, "threads_per_process": 1, "repeats": repeats},
        "sequential": {"step_s": stats(ref)},
        "rows": rows_out,
    }


def table_rows(result: dict) -> list:
    if "skipped" in result:
        return [row("pipeline", "engine=pipelining", None, "sequential model_parallel", None, result["skipped"], "ms/step")]
    ms = lambda s: {k: (v * 1000 if k in ("median", "min", "max") else v) for k, v in s.items()}  # noqa: E731
    out = []
    for r in result["rows"]:
        sp = r["speedup"]
        out.append(row(
            "pipeline", f"engine=pipelining, 2 proc, M={r['micro_batches']}", ms(r["step_s"]), "sequential model_parallel, 1 proc", ms(result["sequential"]["step_s"]),
            f"speed-up {sp['median']:.2f} ({sp['min']:.2f}-{sp['max']:.2f})", "ms/step", f"ideal {r['ideal']:.2f}",
        ))
    return out


def run(quick: bool = False, repeats: int = 0, micro=(1, 2, 4, 8), balance: str = "time") -> dict:
    params = dict(QUICK if quick else FULL)
    if repeats:
        params["repeats"] = repeats
    before = machine_info()
    start = time.perf_counter()
    result = measure(micro=tuple(micro), balance=balance, **params)
    result.update(benchmark="pipeline_efficiency", mode="quick" if quick else "full", machine=before, load_after=machine_info()["load_avg_1_5_15"], wall_s=time.perf_counter() - start)
    result["table"] = table_rows(result)
    write_result("pipeline_efficiency", result)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--repeats", type=int, default=0)
    parser.add_argument("--micro", default="1,2,4,8")
    parser.add_argument("--balance", default="time", help="stage split for both sides: time (equal measured forward time) or params")
    args = parser.parse_args()
    result = run(args.quick, args.repeats, [int(x) for x in args.micro.split(",")], args.balance)
    seq = result["sequential"]["step_s"]
    print(f"sequential model-parallel reference: {seq['median']*1000:.0f} ms/step ({seq['min']*1000:.0f}-{seq['max']*1000:.0f})")
    print(f"{'micro-batches':>13s} {'ms/step':>9s} {'min-max ms':>13s} {'speed-up':>17s} {'ideal':>6s}")
    for r in result["rows"]:
        s, sp = r["step_s"], r["speedup"]
        print(f"{r['micro_batches']:13d} {s['median']*1000:9.0f} {s['min']*1000:6.0f}-{s['max']*1000:<6.0f} {sp['median']:5.2f} ({sp['min']:.2f}-{sp['max']:.2f}) {r['ideal']:6.2f}")


if __name__ == "__main__":
    main()
