"""Pipeline efficiency on CPU: the pipelining engine (2 stages on 2 processes, 1 thread each)
against the same 2-stage model run sequentially in one process (model_parallel, 1 thread),
for 1/2/4/8 micro-batches, next to the fill-drain ideal M/(M+S-1) x S.

Both sides run through `hpc-train` with identical model, data, batch and steps; the figure is
the median time per step over `--repeats` runs (images/s measured after warm-up steps).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
STAGES = 2


def run(overrides, run_dir: Path) -> float:
    env = dict(os.environ, OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="")
    cmd = [sys.executable, "-m", "hpc_train.cli", *overrides, f"hydra.run.dir={run_dir}"]
    subprocess.run(cmd, check=True, capture_output=True, env=env)
    summary = json.loads((run_dir / "summary.json").read_text())
    return summary["global_batch"] / summary["images_per_sec"]  # seconds per step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--model", default="resnet18")
    parser.add_argument("--image-size", type=int, default=64)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--micro", default="1,2,4,8")
    parser.add_argument("--balance", default="time", help="stage split for both sides: time (equal measured forward time) or params")
    args = parser.parse_args()
    common = [
        f"model={args.model}", "data=synthetic", f"data.image_size={args.image_size}", "data.num_samples=1024",
        f"trainer.batch_size={args.batch}", f"trainer.max_steps={args.steps}", "trainer.epochs=null", "trainer.eval=false",
        "trainer.progress=false", "trainer.throughput_warmup_steps=3", f"strategy.stages={STAGES}", f"strategy.balance={args.balance}",
    ]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        def median_time(name, overrides):
            times = [run([*common, *overrides], Path(tmp) / f"{name}-{i}") for i in range(args.repeats)]
            return statistics.median(times), min(times), max(times)

        ref = median_time("sequential", ["strategy=model_parallel", f"resources.gpus_per_node={STAGES}"])
        for m in [int(x) for x in args.micro.split(",")]:
            t = median_time(f"pipe{m}", ["strategy=pipeline", "strategy.engine=pipelining", f"resources.gpus_per_node={STAGES}", f"strategy.chunks={m}"])
            rows.append({"micro_batches": m, "step_s": t[0], "step_min_s": t[1], "step_max_s": t[2], "speedup": ref[0] / t[0], "ideal": m / (m + STAGES - 1) * STAGES})
    print(f"sequential model-parallel reference: {ref[0]*1000:.0f} ms/step (min {ref[1]*1000:.0f}, max {ref[2]*1000:.0f})")
    print(f"{'micro-batches':>13s} {'ms/step':>9s} {'min-max ms':>13s} {'speed-up':>9s} {'ideal':>6s}")
    for r in rows:
        print(f"{r['micro_batches']:13d} {r['step_s']*1000:9.0f} {r['step_min_s']*1000:6.0f}-{r['step_max_s']*1000:<6.0f} {r['speedup']:9.2f} {r['ideal']:6.2f}")
    out = HERE / "results"
    out.mkdir(exist_ok=True)
    record = {"benchmark": "pipeline_efficiency", "date": time.strftime("%Y-%m-%d"), "machine": platform.node(), "cpus": os.cpu_count(), "args": vars(args), "sequential": {"step_s": ref[0], "min_s": ref[1], "max_s": ref[2]}, "rows": rows}
    (out / "pipeline_efficiency.json").write_text(json.dumps(record, indent=2))


if __name__ == "__main__":
    main()
