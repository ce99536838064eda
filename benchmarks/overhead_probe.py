"""Where a short run's time goes, step by step, on both sides of the overhead benchmark.

Runs `overhead.py`'s two commands (hpc-train strategy=single and the plain loop, same model,
data, batch, threads) in ABBA pairs with benchmarks/stepprobe/ first on PYTHONPATH: every
process records, per training step, when the DataLoader's `__next__` started and ended and
when the optimizer step started and ended (no change to either program). A step's time is
split into

* fetch: DataLoader `__next__` (sampler, dataset indexing, collate);
* compute: end of fetch to start of the optimizer step (zero_grad, input copy, forward, backward);
* optimizer: the optimizer step;
* between: end of the optimizer step to the next fetch (LR schedule, loss read, metrics and
  progress lines, checkpoint/stop checks; for the last step, up to the end of the loop's
  window is not probed and counts as 0).

It prints, for every step index, the median over runs of each part on both sides, and the
images/s of the summary window (from the end of step `warmup` to the end of the last step)
as computed from the probe, next to what summary.json / the plain loop reported.

    python benchmarks/overhead_probe.py --pairs 4 --steps 10 --warmup 2
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (
    HERE,
    PYTHON,
    STEPPROBE,
    clean_run,
    cpu_env,
    hpc_train_cmd,
    load,
    machine_info,
    probe_record,
    read_json,
    run_checked,
    write_result,
)  # noqa: E402


def _steps(record: dict) -> list:
    """Per step: fetch, compute, optimizer, between (seconds), and the step's end time."""
    fs, fe, os_, oe = (record[k] for k in ("fetch_start", "fetch_end", "opt_start", "opt_end"))
    n = len(oe)
    fs, fe = fs[-n - 1 :], fe[-n - 1 :]  # a trailing __next__ may end the loader (StopIteration)
    out = []
    for k in range(n):
        nxt = fs[k + 1] if k + 1 < len(fs) else oe[k]
        out.append(
            {
                "fetch": fe[k] - fs[k],
                "compute": os_[k] - fe[k],
                "optimizer": oe[k] - os_[k],
                "between": max(0.0, nxt - oe[k]),
                "end": oe[k],
                "start": fs[k],
            }
        )
    return out


def _one(cmd, env, probe_dir: Path) -> list:
    for old in probe_dir.glob("steps-*.json"):
        old.unlink()
    run_checked(cmd, env=env)
    record = probe_record(probe_dir)
    return _steps(record) + [{"hpc_train": record.get("hpc_train")}]


def measure(
    pairs: int,
    steps: int,
    warmup: int,
    batch: int = 64,
    image_size: int = 64,
    threads: int = 0,
    model: str = "resnet18",
    extra=(),
) -> dict:
    threads = threads or os.cpu_count() or 1
    env = cpu_env(threads) | {
        "PYTHONPATH": os.pathsep.join([str(STEPPROBE), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    }
    samples = batch * steps
    runs = {"hpc": [], "plain": []}
    reported = {"hpc": [], "plain": []}
    loads, foreign = [], []
    with tempfile.TemporaryDirectory(prefix="bench-probe-") as tmp:
        probe_dir = Path(tmp) / "probe"
        probe_dir.mkdir()
        env["HPC_BENCH_STEPPROBE_DIR"] = str(probe_dir)

        def hpc(i):
            run_dir = Path(tmp) / f"hpc{i}"
            return (
                "hpc",
                _one(
                    hpc_train_cmd(
                        [
                            "strategy=single",
                            f"model={model}",
                            "data=synthetic",
                            f"data.image_size={image_size}",
                            f"data.num_samples={samples}",
                            f"trainer.batch_size={batch}",
                            f"trainer.max_steps={steps}",
                            "trainer.epochs=null",
                            "trainer.eval=false",
                            f"trainer.throughput_warmup_steps={warmup}",
                            f"hydra.run.dir={run_dir}",
                            *extra,
                        ]
                    ),
                    env,
                    probe_dir,
                ),
                read_json(run_dir / "summary.json")["images_per_sec"],
            )

        def plain(i):
            out = Path(tmp) / f"plain{i}.json"
            return (
                "plain",
                _one(
                    [
                        PYTHON,
                        str(HERE / "plain_train.py"),
                        f"--model={model}",
                        f"--image-size={image_size}",
                        f"--num-samples={samples}",
                        f"--batch={batch}",
                        f"--steps={steps}",
                        f"--warmup={warmup}",
                        f"--threads={threads}",
                        "--device=cpu",
                        f"--out={out}",
                    ],
                    env,
                    probe_dir,
                ),
                read_json(out)["images_per_sec"],
            )

        for i in range(pairs):
            loads.append(load())
            order = (hpc, plain) if i % 2 == 0 else (plain, hpc)
            pair, record = clean_run(
                lambda i=i, order=order: [side(i) for side in order], log=lambda msg: print(msg, flush=True)
            )  # repeated if others used the CPUs
            foreign.append(record)
            for side, steps_of_run, ips in pair:
                runs[side].append(steps_of_run)
                reported[side].append(ips)
    imported = {side: sorted({r.pop()["hpc_train"] or "-" for r in side_runs}) for side, side_runs in runs.items()}
    per_step = {}
    for side, side_runs in runs.items():
        per_step[side] = [
            {
                part: statistics.median(r[k][part] for r in side_runs)
                for part in ("fetch", "compute", "optimizer", "between")
            }
            for k in range(steps)
        ]
    window = {
        side: [batch * (steps - warmup) / (r[-1]["end"] - r[warmup - 1]["end"]) for r in side_runs]
        for side, side_runs in runs.items()
    }
    return {
        "config": {
            "model": model,
            "image_size": image_size,
            "batch": batch,
            "steps": steps,
            "warmup": warmup,
            "threads": threads,
            "pairs": pairs,
            "extra": list(extra),
        },
        "hpc_train_imported_from": imported,
        "per_step_median_s": per_step,
        "probe_window_images_per_sec": window,
        "reported_images_per_sec": reported,
        "ratios_reported": [h / p for h, p in zip(reported["hpc"], reported["plain"])],
        "load_before_pairs": loads,
        "foreign_cores_per_pair": foreign,
        "raw": runs,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs", type=int, default=4)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--threads", type=int, default=0)
    parser.add_argument("--name", default="overhead_probe", help="results/<name>.json")
    parser.add_argument("extra", nargs="*", help="extra hpc-train overrides (e.g. trainer.progress=false)")
    args = parser.parse_args()
    before = machine_info()
    result = measure(args.pairs, args.steps, args.warmup, threads=args.threads, extra=args.extra)
    result.update(benchmark="overhead_probe", machine=before, load_after=load())
    write_result(args.name, result)
    ms = lambda x: f"{x * 1000:7.1f}"  # noqa: E731
    print(f"per-step median over {args.pairs} runs each side, ms (fetch / compute / optimizer / between)")
    print(f"{'step':>4s} | {'hpc-train':^35s} | {'plain loop':^35s} | {'hpc - plain':>11s}")
    for k in range(args.steps):
        h, p = result["per_step_median_s"]["hpc"][k], result["per_step_median_s"]["plain"][k]
        th, tp = sum(h.values()), sum(p.values())
        print(
            f"{k + 1:4d} | {ms(h['fetch'])} {ms(h['compute'])} {ms(h['optimizer'])} {ms(h['between'])} | "
            f"{ms(p['fetch'])} {ms(p['compute'])} {ms(p['optimizer'])} {ms(p['between'])} | {ms(th - tp)}"
        )
    for side in ("hpc", "plain"):
        print(
            f"{side:6s} reported images/s {['%.1f' % x for x in result['reported_images_per_sec'][side]]}, probe "
            f"window {['%.1f' % x for x in result['probe_window_images_per_sec'][side]]}"
        )
    print(
        "paired ratios (reported):",
        ["%.3f" % x for x in result["ratios_reported"]],
        "median %.3f" % statistics.median(result["ratios_reported"]),
    )
    print("hpc_train imported from:", result["hpc_train_imported_from"])
    print("load before each pair:", result["load_before_pairs"], "after:", result["load_after"])


if __name__ == "__main__":
    main()
