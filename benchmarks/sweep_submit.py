"""Login-node cost of a Hydra sweep of N Slurm jobs with per-job layouts: compose, validate, lay out (and submit).

The sweep is `strategy=single,ddp x resources.gpus_per_node=1,2 x seed=0..N/4-1` (four
layouts). `--dry-run` times `hpc-train -m ... dry_run=true` (everything but sbatch: what a
login node pays before the first job is queued; Slurm's commands are taken off PATH so the
figure is hpc-train's own) and reads the command's peak memory; without
it the jobs are really submitted to the local test cluster (held, then cancelled; start it with
`bash scripts/slurm_test_cluster.sh start`). Each case runs `--repeats` times; the table gives
the median, the spread and the peak RSS. The reference row is one `hpc-train dry_run=true` job:
Python, Hydra and hpc-train starting, which every sweep pays once.
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
from typing import List, Optional, Tuple

HERE = Path(__file__).resolve().parent
COMMON = [
    "launcher=slurm",
    "cluster.cpus_per_gpu=1",
    "cluster.time=5",
    "model=toy_mlp",
    "data=synthetic",
    "data.image_size=8",
    "trainer.max_steps=2",
    "trainer.epochs=null",
    "trainer.batch_size=16",
]


def _without_slurm() -> dict:
    """This environment minus Slurm's commands: a dry run then measures hpc-train alone (no squeue/sacctmgr answers,
    no MaxJobCount of a test cluster that already holds jobs)."""
    keep = [d for d in os.environ.get("PATH", "").split(os.pathsep) if d and not (Path(d) / "sbatch").exists()]
    return dict(os.environ, PATH=os.pathsep.join([str(Path(sys.executable).parent), *keep]))


def _timed(cmd: List[str], env: Optional[dict] = None) -> Tuple[float, float]:
    """(wall seconds, peak RSS MB) of one command, read from its own rusage (os.wait4)."""
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
    err = proc.stderr.read() if proc.stderr else ""
    _, status, usage = os.wait4(proc.pid, 0)
    elapsed = time.perf_counter() - start
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"failed: {' '.join(cmd)}\n{err[-2000:]}")
    return elapsed, usage.ru_maxrss / 1024


def sweep(jobs: int, sweep_dir: Path, dry_run: bool) -> Tuple[float, float]:
    cmd = [
        sys.executable,
        "-m",
        "hpc_train.cli",
        "-m",
        *COMMON,
        "strategy=single,ddp",
        "resources.gpus_per_node=1,2",
        f"seed=range(0,{jobs // 4})",
        f"hydra.sweep.dir={sweep_dir}",
    ]
    cmd += ["dry_run=true"] if dry_run else ["+cluster.extra.hold=true"]
    elapsed, rss = _timed(cmd, _without_slurm() if dry_run else None)
    if not dry_run:
        ids = {line.split("\t")[0].split("_")[0] for line in (sweep_dir / "jobs.tsv").read_text().splitlines()[1:]}
        subprocess.run(["scancel", *ids], check=False)
    return elapsed, rss


def reference(run_dir: Path) -> Tuple[float, float]:
    return _timed(
        [sys.executable, "-m", "hpc_train.cli", *COMMON, "dry_run=true", f"hydra.run.dir={run_dir}"], _without_slurm()
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--jobs", type=int, nargs="+", default=[10000])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--dry-run", action="store_true", help="stop before sbatch (no cluster needed)")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        runs = [reference(Path(tmp) / f"ref{i}") for i in range(args.repeats)]
        rows.append(("1 (reference: one dry-run job)", runs))
        for jobs in args.jobs:
            runs = [sweep(jobs, Path(tmp) / f"sweep{jobs}-{i}", args.dry_run) for i in range(args.repeats)]
            rows.append((f"{jobs:,} ({'dry run' if args.dry_run else 'submitted, held'})", runs))
    print(f"{'jobs':32s} {'median s':>9s} {'min-max s':>13s} {'ms/job':>7s} {'peak MB':>8s}")
    results = []
    for label, runs in rows:
        times = [t for t, _ in runs]
        median = statistics.median(times)
        count = int(label.split()[0].replace(",", ""))
        print(
            f"{label:32s} {median:9.2f} {min(times):6.2f}-{max(times):<6.2f} {1000 * median / count:7.2f}"
            f" {max(r for _, r in runs):8.0f}"
        )
        results.append({"case": label, "times_s": times, "median_s": median, "peak_rss_mb": max(r for _, r in runs)})
    out = HERE / "results"
    out.mkdir(exist_ok=True)
    (out / ("sweep_submit_dry_run.json" if args.dry_run else "sweep_submit.json")).write_text(
        json.dumps(
            {
                "benchmark": "sweep_submit",
                "date": time.strftime("%Y-%m-%d"),
                "machine": platform.node(),
                "cpus": os.cpu_count(),
                "dry_run": args.dry_run,
                "results": results,
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
