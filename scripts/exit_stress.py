"""Stress test: many short 2-rank fsdp and ddp runs under CPU load; count ranks that fail after training finished.

A finished 2-rank fsdp run can abort in rank 1's interpreter shutdown ("terminate called without
an active exception", exit -6), failing a job that had trained to the end, unless every rank frees
its training objects before the process group is destroyed
(hpc_train.compute.entry.train.release_before_teardown). This runs N jobs (alternating fsdp and ddp,
toy MLP, 6 steps, gloo on CPU) while a busy-loop process loads one core, and reports how many
exited non-zero, and how many of those printed "terminate called".

    .venv/bin/python scripts/exit_stress.py --runs 200      # about 15 minutes on 2 cores
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
JOB = [
    "model=toy_mlp",
    "data=synthetic",
    "data.image_size=8",
    "data.num_samples=256",
    "data.val_samples=64",
    "trainer.progress=false",
    "trainer.epochs=null",
    "trainer.max_steps=6",
    "trainer.batch_size=32",
    "trainer.checkpoint_every=3",
    "resources.gpus_per_node=2",
]


def burn(stop_at: float) -> None:
    while time.time() < stop_at:
        pass


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "exit_stress.json")
    args = parser.parse_args()
    load = multiprocessing.Process(target=burn, args=(time.time() + 24 * 3600,), daemon=True)
    load.start()
    results = {"fsdp": [0, 0, 0], "ddp": [0, 0, 0]}  # runs, failed, aborted ("terminate called")
    started = time.time()
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
    try:
        with tempfile.TemporaryDirectory() as scratch:
            for index in range(args.runs):
                strategy = "fsdp" if index % 2 == 0 else "ddp"
                run_dir = Path(scratch) / f"run{index}"
                proc = subprocess.run(
                    [sys.executable, "-m", "hpc_train.cli", f"strategy={strategy}", *JOB, f"hydra.run.dir={run_dir}"],
                    capture_output=True,
                    text=True,
                    cwd=REPO,
                    env=env,
                )
                output = (
                    proc.stdout
                    + proc.stderr
                    + "".join(p.read_text(errors="replace") for p in (run_dir / "logs").glob("rank*.out"))
                )
                row = results[strategy]
                row[0] += 1
                if proc.returncode != 0:
                    row[1] += 1
                    row[2] += int("terminate called" in output)
                    print(f"run {index} ({strategy}) exited {proc.returncode}:\n{output[-2000:]}", file=sys.stderr)
                if (index + 1) % 20 == 0:
                    print(f"{index + 1} runs, {time.time() - started:.0f} s", flush=True)
    finally:
        load.terminate()
    print(f"{'strategy':8s} {'runs':>5s} {'failed':>7s} {'aborted':>8s}")
    for strategy, (runs, failed, aborted) in results.items():
        print(f"{strategy:8s} {runs:5d} {failed:7d} {aborted:8d}")
    record = {
        "runs": args.runs,
        "seconds": round(time.time() - started, 1),
        "results": {k: dict(zip(("runs", "failed", "aborted"), v)) for k, v in results.items()},
        "load": "one busy-loop process on one of the machine's cores",
        "job": JOB,
    }
    args.out.write_text(json.dumps(record, indent=2) + "\n")
    return 0 if all(v[1] == 0 for v in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
