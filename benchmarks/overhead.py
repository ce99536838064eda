"""Training overhead on CPU: `hpc-train strategy=single` against a plain hand-written PyTorch loop.

Same model (ResNet-18, random init), same data (hpc-train's `data=synthetic` tensors, read
through a shuffling DataLoader with num_workers=0 on both sides), same global batch, precision
(fp32), optimizer (SGD momentum 0.9, weight decay 5e-4, cosine schedule), number of steps and
intra-op threads (OMP_NUM_THREADS and torch.set_num_threads). Both sides report images/s the
same way: global batch x steps after the first `warmup` steps, over the time from the end of
step `warmup` to the end of the last step; hpc-train's figure is `summary.json`'s
`images_per_sec` (`trainer.throughput_warmup_steps=warmup`), the plain loop's is computed by
benchmarks/plain_train.py the same way. Process start-up, data generation and model build are
outside the timed window on both sides.

Runs alternate in ABBA order (hpc-train, plain, plain, hpc-train, ...), each in a fresh process; the figure is
the median of the paired ratios hpc-train / plain, with their min-max. Target: >= 0.98.

Both sides also run with benchmarks/stepprobe/ first on PYTHONPATH (a hook on the optimizer
step, ~1 us a step, the same on both sides), which gives every step's duration (end of one
optimizer step to the end of the next). `median_step_ratio` is, per pair, the plain loop's median
step time over hpc-train's (steps after the warm-up): insensitive to a burst that slows a few
steps, blind to a cost that hits fewer than half of the steps (which the window ratio counts).
"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (
    HERE,
    PYTHON,
    STEPPROBE,
    clean_run,
    cpu_env,
    fmt_stats,
    git_commit,
    hpc_train_cmd,
    import_root,
    load,
    machine_info,
    paired_ratios,
    probe_record,
    read_json,
    row,
    run_checked,
    stats,
    write_result,
)  # noqa: E402

TARGET = 0.98
FULL = {"repeats": 10, "steps": 30, "warmup": 5}
QUICK = {"repeats": 6, "steps": 20, "warmup": 3}  # 4 pairs x 10 steps could not resolve 2 % (see README)


def median_step_s(probe_dir: Path, warmup: int) -> float:
    """Median duration of the steps after the warm-up, from the step probe's record of the run."""
    ends = probe_record(probe_dir)["opt_end"]
    return statistics.median(b - a for a, b in zip(ends[warmup - 1 :], ends[warmup:]))


def measure(
    repeats: int,
    steps: int,
    warmup: int,
    batch: int = 64,
    image_size: int = 64,
    threads: int = 0,
    model: str = "resnet18",
    baseline_tree: str = "",
) -> dict:
    threads = threads or os.cpu_count() or 1
    samples = batch * steps  # one epoch: no epoch boundary inside the timed window
    env = cpu_env(threads)
    hpc, plain, base, loads, rounds = [], [], [], [], []
    hpc_step, plain_step, base_step = [], [], []
    tries = itertools.count()  # a round repeated by clean_run runs again in fresh folders
    with tempfile.TemporaryDirectory(prefix="bench-overhead-") as tmp:

        def probed(name: str, tree: str = "") -> tuple:
            """Environment and probe dir of one run: the step probe first on PYTHONPATH (then `tree`)."""
            probe_dir = Path(tmp) / f"probe-{name}-{next(tries)}"
            probe_dir.mkdir()
            path = os.pathsep.join(x for x in (str(STEPPROBE), tree and str(import_root(Path(tree)))) if x)
            return env | {"PYTHONPATH": path, "HPC_BENCH_STEPPROBE_DIR": str(probe_dir)}, probe_dir

        def hpc_train(i: int, tree: str) -> tuple:
            name = f"hpc{'-base' if tree else ''}{i}"
            run_dir = Path(tmp) / f"{name}-{next(tries)}"
            run_env, probe_dir = probed(name, tree)
            run_checked(
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
                    ]
                ),
                env=run_env,
                cwd=Path(tree) if tree else None,
            )
            return read_json(run_dir / "summary.json")["images_per_sec"], median_step_s(probe_dir, warmup)

        def run_hpc(i: int) -> tuple:
            return hpc_train(i, "")

        def run_base(i: int) -> tuple:  # another checkout's hpc_train (e.g. a git worktree of an older commit)
            return hpc_train(i, str(Path(baseline_tree).resolve()))

        def run_plain(i: int) -> tuple:
            out = Path(tmp) / f"plain{i}-{next(tries)}.json"
            run_env, probe_dir = probed(f"plain{i}")
            run_checked(
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
                env=run_env,
            )
            return read_json(out)["images_per_sec"], median_step_s(probe_dir, warmup)

        orders = (
            list(itertools.permutations((run_hpc, run_plain, run_base)))
            if baseline_tree
            else [(run_hpc, run_plain), (run_plain, run_hpc)]
        )
        lists = {run_hpc: hpc, run_plain: plain, run_base: base}
        step_lists = {run_hpc: hpc_step, run_plain: plain_step, run_base: base_step}
        for i in range(
            repeats
        ):  # ABBA order (with a baseline: every order of the three in turn), so a drift favours no side
            loads.append(load())
            order = orders[i % len(orders)]
            # a round during which other processes used the CPUs is repeated (common.clean_run)
            values, record = clean_run(
                lambda i=i, order=order: [side(i) for side in order], log=lambda msg: print(msg, flush=True)
            )
            rounds.append(record)
            for side, (value, step_s) in zip(order, values):
                lists[side].append(value)
                step_lists[side].append(step_s)
    ratios = paired_ratios(hpc, plain)
    result = {
        "config": {
            "model": model,
            "image_size": image_size,
            "batch": batch,
            "steps": steps,
            "warmup": warmup,
            "threads": threads,
            "precision": "32",
            "repeats": repeats,
            "data": "synthetic TensorDataset, DataLoader(shuffle, num_workers=0)",
        },
        "hpc_train_images_per_sec": stats(hpc),
        "plain_images_per_sec": stats(plain),
        "ratio": stats(ratios),
        "hpc_train_median_step_s": stats(hpc_step),
        "plain_median_step_s": stats(plain_step),
        "median_step_ratio": stats(
            paired_ratios(plain_step, hpc_step)
        ),  # plain / hpc-train step time = hpc-train / plain speed
        "target": TARGET,
        "load_before_each_round": loads,
        # other processes' CPU use during each try of each round; a round is repeated above common.FOREIGN_MAX
        "foreign_cores_per_round": rounds,
    }
    if baseline_tree:
        result["baseline"] = {
            "tree": str(Path(baseline_tree).resolve()),
            "commit": git_commit(Path(baseline_tree), mark_dirty=False),
            "images_per_sec": stats(base),
            "ratio": stats(paired_ratios(base, plain)),
            "this_over_baseline": stats(paired_ratios(hpc, base)),
            "median_step_ratio": stats(paired_ratios(plain_step, base_step)),
        }
    return result


def rows(result: dict) -> list:
    if "skipped" in result:
        return [
            row(
                "overhead", "hpc-train strategy=single", None, "plain PyTorch loop", None, result["skipped"], "images/s"
            )
        ]
    c = result["config"]
    r = result["ratio"]
    return [
        row(
            "overhead",
            f"hpc-train strategy=single ({c['model']}, CPU, {c['threads']} threads)",
            result["hpc_train_images_per_sec"],
            "plain PyTorch loop",
            result["plain_images_per_sec"],
            f"ratio {r['median']:.3f} ({r['min']:.3f}-{r['max']:.3f})",
            "images/s",
            f">= {TARGET}",
        )
    ]


def run(quick: bool = False, repeats: int = 0, threads: int = 0, baseline_tree: str = "") -> dict:
    params = dict(QUICK if quick else FULL)
    if repeats:
        params["repeats"] = repeats
    before = machine_info()
    start = time.perf_counter()
    result = measure(threads=threads, baseline_tree=baseline_tree, **params)
    result.update(
        benchmark="overhead",
        mode="quick" if quick else "full",
        machine=before,
        load_after=machine_info()["load_avg_1_5_15"],
        wall_s=time.perf_counter() - start,
    )
    result["table"] = rows(result)
    write_result("overhead", result)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--repeats", type=int, default=0)
    parser.add_argument("--threads", type=int, default=0, help="intra-op threads on both sides (default: all CPUs)")
    parser.add_argument(
        "--baseline-tree",
        default="",
        help=(
            "also run another checkout's hpc-train (e.g. `git worktree add /tmp/before <commit>`), interleaved with "
            "the other two"
        ),
    )
    args = parser.parse_args()
    result = run(args.quick, args.repeats, args.threads, args.baseline_tree)
    print(f"{'side':28s} {'images/s median (min-max)':>28s}")
    print(f"{'hpc-train strategy=single':28s} {fmt_stats(result['hpc_train_images_per_sec'], 1):>28s}")
    print(f"{'plain PyTorch loop':28s} {fmt_stats(result['plain_images_per_sec'], 1):>28s}")
    if "baseline" in result:
        b = result["baseline"]
        print(f"{'hpc-train at ' + b['commit']:28s} {fmt_stats(b['images_per_sec'], 1):>28s}")
    print(f"ratio hpc-train / plain: {fmt_stats(result['ratio'], 3)}  (target >= {TARGET})")
    print(f"ratio of median step times, plain / hpc-train: {fmt_stats(result['median_step_ratio'], 3)}")
    if "baseline" in result:
        print(
            f"ratio hpc-train at {b['commit']} / plain: {fmt_stats(b['ratio'], 3)}; this checkout / "
            f"{b['commit']}: {fmt_stats(b['this_over_baseline'], 3)}"
        )


if __name__ == "__main__":
    main()
