"""Login-node latency: `hpc-train launcher=slurm dry_run=true` against `python -c "import torch"`.

Both are run as fresh processes, alternately, `--repeats` times; the table shows the median
and the spread (min-max). Results go to benchmarks/results/login_latency.json.
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


def wall(command: list) -> float:
    start = time.perf_counter()
    subprocess.run(command, check=True, capture_output=True)
    return time.perf_counter() - start


def measure(repeats: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        cases = {
            "hpc-train launcher=slurm dry_run=true": [sys.executable, "-m", "hpc_train.cli", "launcher=slurm", "dry_run=true", f"hydra.run.dir={tmp}/run"],
            'python -c "import torch" (reference)': [sys.executable, "-c", "import torch"],
        }
        for command in cases.values():  # warm the page cache once
            wall(command)
        times = {name: [] for name in cases}
        for _ in range(repeats):
            for name, command in cases.items():
                times[name].append(wall(command))
    return {name: {"median_s": statistics.median(t), "min_s": min(t), "max_s": max(t), "runs": len(t)} for name, t in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    results = measure(args.repeats)
    print(f"{'command':45s} {'median s':>9s} {'min-max s':>13s}")
    for name, r in results.items():
        print(f"{name:45s} {r['median_s']:9.2f} {r['min_s']:6.2f}-{r['max_s']:<6.2f}")
    names = list(results)
    ratio = results[names[1]]["median_s"] / results[names[0]]["median_s"]
    print(f"dry run is {ratio:.1f}x faster than importing torch")
    out = HERE / "results"
    out.mkdir(exist_ok=True)
    record = {"benchmark": "login_latency", "date": time.strftime("%Y-%m-%d"), "machine": platform.node(), "python": platform.python_version(), "results": results, "torch_import_over_dry_run": ratio}
    (out / "login_latency.json").write_text(json.dumps(record, indent=2))


if __name__ == "__main__":
    main()
