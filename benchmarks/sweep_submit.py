"""Wall time to submit a Hydra sweep of N Slurm jobs with per-job layouts (local test cluster).

Submits `strategy=single,ddp x resources.gpus_per_node=1,2 x seed=0..N/4-1` (three distinct
layouts, so three job arrays), times the `hpc-train -m` command from start to exit, then
cancels the jobs. Needs the test cluster: `bash scripts/slurm_test_cluster.sh start`.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def submit(jobs: int, sweep_dir: Path) -> float:
    cmd = [
        sys.executable, "-m", "hpc_train.cli", "-m", "launcher=slurm", "cluster.cpus_per_gpu=1", "cluster.time=5",
        "model=toy_mlp", "data=synthetic", "data.image_size=8", "trainer.max_steps=2", "trainer.epochs=null", "trainer.batch_size=16",
        "strategy=single,ddp", "resources.gpus_per_node=1,2", f"seed=range(0,{jobs // 4})", f"hydra.sweep.dir={sweep_dir}",
    ]
    start = time.perf_counter()
    subprocess.run(cmd, check=True, capture_output=True)
    elapsed = time.perf_counter() - start
    ids = {line.split("\t")[0].split("_")[0] for line in (sweep_dir / "jobs.tsv").read_text().splitlines()[1:]}
    subprocess.run(["scancel", *ids], check=False)
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--jobs", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        times = [submit(args.jobs, Path(tmp) / f"sweep{i}") for i in range(args.repeats)]
    median = statistics.median(times)
    print(f"{'jobs':>5s} {'median s':>9s} {'min-max s':>11s} {'ms/job':>7s}")
    print(f"{args.jobs:5d} {median:9.2f} {min(times):5.2f}-{max(times):<5.2f} {1000 * median / args.jobs:7.1f}")
    out = HERE / "results"
    out.mkdir(exist_ok=True)
    (out / "sweep_submit.json").write_text(json.dumps({"benchmark": "sweep_submit", "date": time.strftime("%Y-%m-%d"), "machine": platform.node(), "jobs": args.jobs, "times_s": times, "median_s": median}, indent=2))


if __name__ == "__main__":
    main()
