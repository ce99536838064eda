"""Run every benchmark, print one table, write JSON to benchmarks/results/.

    python benchmarks/run.py            # full: about 12 minutes on 2 quiet cores
    python benchmarks/run.py --quick    # fewer repeats and steps: about 5 minutes on 2 quiet cores
    python benchmarks/run.py --only overhead,ddp
    python benchmarks/run.py --table    # no run: the markdown table from the saved JSON (for the README)

Each benchmark writes benchmarks/results/<name>.json (config, machine, versions, load, raw values)
and run.py writes benchmarks/results/run.json (all table rows). Every figure is the median over
repeats with the min-max beside it, next to its reference measured in the same run. The machine's
CPU busy fraction is sampled before starting: numbers taken on a busy machine are not worth
publishing (run.py says so).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import ddp_scaling  # noqa: E402
import gpu_throughput  # noqa: E402
import login_latency  # noqa: E402
import overhead  # noqa: E402
import pipeline_efficiency  # noqa: E402
from common import RESULTS, cpu_busy, fmt_stats, machine_info, row, write_result  # noqa: E402

BENCHMARKS = {
    "login": ("login_latency", lambda a: login_latency.run(a.quick, start_cluster=a.start_cluster)),
    "overhead": ("overhead", lambda a: overhead.run(a.quick)),
    "ddp": ("ddp_scaling", lambda a: ddp_scaling.run(a.quick)),
    "pipeline": ("pipeline_efficiency", lambda a: pipeline_efficiency.run(a.quick)),
    "gpu": ("gpu_throughput", lambda a: gpu_throughput.run(a.quick)),
}
BUSY_WARN = 0.15


def _digits(unit: str) -> int:
    return 0 if unit in ("ms/step",) else (1 if unit == "images/s" else 2)


def render(rows, markdown: bool) -> str:
    head = [
        "benchmark",
        "measured",
        "median (min-max)",
        "reference (same run)",
        "median (min-max)",
        "unit",
        "figure",
        "target",
    ]
    body = [
        [
            r["benchmark"],
            r["measured"],
            fmt_stats(r["value"], _digits(r["unit"])),
            r["reference"],
            fmt_stats(r["ref_value"], _digits(r["unit"])),
            r["unit"],
            r["figure"],
            r["target"] or "",
        ]
        for r in rows
    ]
    if markdown:
        lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        lines += ["| " + " | ".join(cell.replace("|", "\\|") for cell in line) + " |" for line in body]
        return "\n".join(lines)
    widths = [max(len(str(x[i])) for x in [head, *body]) for i in range(len(head))]
    fmt = "  ".join(f"{{:{w}s}}" for w in widths)
    return "\n".join([fmt.format(*head), fmt.format(*["-" * w for w in widths]), *[fmt.format(*line) for line in body]])


def saved_rows(names) -> list:
    rows = []
    for key in names:
        path = RESULTS / f"{BENCHMARKS[key][0]}.json"
        if path.exists():
            rows += json.loads(path.read_text()).get("table", [])
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--quick", action="store_true", help="fewer repeats and steps (about 5 minutes on 2 quiet cores)"
    )
    parser.add_argument(
        "--only", default=",".join(BENCHMARKS), help=f"comma-separated subset of {','.join(BENCHMARKS)}"
    )
    parser.add_argument(
        "--start-cluster",
        action="store_true",
        help="start the Slurm test cluster first (root), for the sweep submission figure",
    )
    parser.add_argument(
        "--table", action="store_true", help="run nothing: print the markdown table from the saved JSON"
    )
    parser.add_argument("--markdown", action="store_true", help="print the table as markdown")
    args = parser.parse_args()
    names = [n.strip() for n in args.only.split(",") if n.strip()]
    unknown = [n for n in names if n not in BENCHMARKS]
    if unknown:
        parser.error(f"unknown benchmark(s) {unknown}; choose from {list(BENCHMARKS)}")
    if args.table:
        print(render(saved_rows(names), markdown=True))
        return

    busy = cpu_busy(2.0)
    machine = machine_info() | {"cpu_busy_before": busy}
    print(
        f"{machine['date']}: {machine['cpus']} x {machine['cpu']}, Python {machine['python']}, torch "
        f"{machine['torch']}, "
        f"load {machine['load_avg_1_5_15']}, CPU busy before start {busy}",
        flush=True,
    )
    if busy is not None and busy > BUSY_WARN:
        print(
            f"WARNING: the machine is {busy:.0%} busy before anything started: these numbers are contaminated; "
            "rerun at a quiet moment.",
            flush=True,
        )
    start = time.perf_counter()
    rows, walls = [], {}
    for key in names:
        name, fn = BENCHMARKS[key]
        t0 = time.perf_counter()
        print(f"[{time.perf_counter() - start:6.0f} s] {name} ...", flush=True)
        try:
            result = fn(args)
            rows += result.get("table", [])
        except Exception as err:  # one failing benchmark must not hide the others
            traceback.print_exc()
            lines = [x.strip() for x in str(err).splitlines() if x.strip()]
            errors = [x for x in lines if "rror" in x] or lines or [type(err).__name__]
            rows.append(row(key, name, None, "", None, f"failed: {errors[-1][:100]}", ""))
        walls[name] = round(time.perf_counter() - t0, 1)
    total = time.perf_counter() - start
    busy_after = cpu_busy(1.0)
    print()
    print(render(rows, markdown=args.markdown))
    print(
        f"\n{len(names)} benchmark(s) in {total:.0f} s ({'quick' if args.quick else 'full'}); per benchmark "
        f"{walls}; CPU busy after: {busy_after}"
    )
    if busy_after is not None and busy_after > BUSY_WARN:
        print(
            f"WARNING: the machine was {busy_after:.0%} busy right after the run (other processes): check the "
            "spreads before publishing."
        )
    write_result(
        "run",
        {
            "mode": "quick" if args.quick else "full",
            "machine": machine,
            "cpu_busy_after": busy_after,
            "wall_s": total,
            "wall_s_per_benchmark": walls,
            "table": rows,
        },
    )


if __name__ == "__main__":
    main()
