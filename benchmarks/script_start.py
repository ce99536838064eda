"""A script of the user's own under hpc-train against a bare torchrun: start-up time and per-step time, CPU.

The script is benchmarks/scriptprobe/train.py, a torchrun-style DDP loop (a 3-layer MLP of width
256, batch 32 a rank, gloo, SGD) that records the wall-clock time of its first line (before any
import), of the end of `import torch`, of the end of `init_process_group`, and the duration of
every step. Three sides run it with 2 ranks on this machine, 1 intra-op thread a rank
(OMP_NUM_THREADS=1), GPUs hidden, from the repository root:

* `hpc-train strategy=ddp resources.gpus_per_node=2 -- benchmarks/scriptprobe/train.py ARGS`
  (the local launcher starts 2 tasks; each runs the script as a child process, rank's variables set);
* the same with `script.launcher=torchrun` (one task running `torchrun --nproc-per-node 2`);
* `torchrun --standalone --nproc-per-node 2 benchmarks/scriptprobe/train.py ARGS` (the reference).

"Start" is measured from the moment the benchmark starts the command (the job's start, as a user
at a shell sees it) to the first line of the *last* rank to get there (its ranks can only work
together from then on); `first rank` and `ready` (the end of init_process_group on the last rank)
are recorded too, as is the whole command's wall time. "Per step" is each rank's median duration
of the steps after the warm-up (the mean is kept too), averaged over the ranks. The launcher's
CPU is read two ways: over the whole run (the CPU time of the command's process tree minus the
ranks' own) and during the timed steps (each rank reads /proc for the processes between itself
and the benchmark: hpc-train's CLI and task processes, or torchrun's agent). Rounds run the three
sides in a rotating order, each in a fresh process tree; a run during which other processes used
more than common.FOREIGN_MAX cores is repeated (common.clean_run). Figures: the medians of the
paired differences hpc-train - torchrun of the start (s) and of the paired ratios of the median
step times.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (
    FOREIGN_MAX,
    HERE,
    PYTHON,
    REPO,
    clean_run,
    cpu_env,
    fmt_stats,
    foreign_cpu,
    hpc_train_cmd,
    load,
    machine_info,
    paired_ratios,
    read_json,
    row,
    run_checked,
    stats,
    write_result,
)  # noqa: E402

PROBE = HERE / "scriptprobe" / "train.py"
FULL = {"repeats": 7, "steps": 500, "warmup": 50}
QUICK = {"repeats": 3, "steps": 200, "warmup": 20}
SIDES = ("hpc_train", "hpc_train_torchrun", "torchrun")
NAMES = {
    "hpc_train": "hpc-train strategy=ddp gpus_per_node=2 -- script",
    "hpc_train_torchrun": "hpc-train ... script.launcher=torchrun -- script",
    "torchrun": "torchrun --standalone --nproc-per-node 2 script",
}
WORLD = 2


def command(side: str, run_dir: Path, out: Path, steps: int, warmup: int) -> List[str]:
    script = [str(PROBE.relative_to(REPO)), f"--out={out}", f"--steps={steps}", f"--warmup={warmup}"]
    if side == "torchrun":
        return [str(Path(PYTHON).parent / "torchrun"), "--standalone", f"--nproc-per-node={WORLD}", *script]
    extra = ["script.launcher=torchrun"] if side == "hpc_train_torchrun" else []
    return hpc_train_cmd(
        ["strategy=ddp", f"resources.gpus_per_node={WORLD}", *extra, f"hydra.run.dir={run_dir}", "--", *script]
    )


def one_run(side: str, tmp: Path, i: int, steps: int, warmup: int) -> Dict[str, float]:
    """Start the command, wait for it, read every rank's record: seconds from the start, per-step ms."""
    run_dir, out = tmp / f"{side}-{i}" / "run", tmp / f"{side}-{i}" / "out"
    cmd = command(side, run_dir, out, steps, warmup)
    cpu0 = os.times()
    launched = time.time()
    run_checked(cmd, env=cpu_env(1) | {"HPC_BENCH_ROOT_PID": str(os.getpid())}, cwd=REPO, timeout=600)
    finished = time.time()
    cpu1 = os.times()
    tree_cpu = (cpu1.children_user + cpu1.children_system) - (cpu0.children_user + cpu0.children_system)
    ranks = [read_json(out / f"rank{r}.json") for r in range(WORLD)]
    window: Dict[str, float] = {}  # the launcher's processes (the ranks' ancestors), each counted once
    for r in ranks:
        for pid, cpu in r["launcher_window_cpu_s"].items():
            window[pid] = max(cpu, window.get(pid, 0.0))
    assert all(r["torch_threads"] == 1 for r in ranks), [r["torch_threads"] for r in ranks]
    assert all(r["under_hpc_train"] == side.startswith("hpc_train") for r in ranks)
    return {
        "start_s": max(r["first_line"] for r in ranks) - launched,
        "first_rank_s": min(r["first_line"] for r in ranks) - launched,
        "imported_s": max(r["imported"] for r in ranks) - launched,
        "ready_s": max(r["ready"] for r in ranks) - launched,
        "script_end_s": max(r["end"] for r in ranks) - launched,
        "wall_s": finished - launched,
        "per_step_ms": 1000 * sum(r["per_step_s"] for r in ranks) / WORLD,
        "median_step_ms": 1000 * sum(r["median_step_s"] for r in ranks) / WORLD,
        "launcher_cpu_s": tree_cpu - sum(r["cpu_s"] for r in ranks),  # every process of the run but the ranks
        "launcher_cores_in_steps": sum(window.values()) / min(r["window_s"] for r in ranks),
    }


def measure(repeats: int, steps: int, warmup: int, attempts: int) -> dict:
    runs: Dict[str, List[Dict[str, float]]] = {side: [] for side in SIDES}
    records, loads = [], []
    with tempfile.TemporaryDirectory(prefix="bench-script-") as tmp:
        for i in range(repeats):
            order = SIDES[i % 3 :] + SIDES[: i % 3]  # rotating, so a drift of the machine favours no side
            loads.append(load())
            for side in order:
                measure_one = lambda side=side, i=i: one_run(side, Path(tmp), i, steps, warmup)  # noqa: E731
                if attempts > 1:
                    value, record = clean_run(measure_one, attempts=attempts, log=lambda m: print(m, flush=True))
                else:  # keep every run, noting other processes' CPU use
                    value, foreign = foreign_cpu(measure_one)
                    record = {"foreign_cores": [foreign], "clean": foreign is None or foreign <= FOREIGN_MAX}
                runs[side].append(value)
                records.append({"round": i, "side": side, **record})
                print(
                    f"round {i} {side:20s} start {value['start_s']:.2f} s, per step {value['per_step_ms']:.3f} ms",
                    flush=True,
                )
    keys = runs["torchrun"][0].keys()
    result = {
        "config": {
            "world": WORLD,
            "threads_per_rank": 1,
            "steps": steps,
            "warmup": warmup,
            "repeats": repeats,
            "model": "MLP 256-256-256-1, batch 32 a rank, gloo, SGD",
            "probe": str(PROBE.relative_to(REPO)),
        },
        "sides": {side: {key: stats([r[key] for r in runs[side]]) for key in keys} for side in SIDES},
        "load_before_each_round": loads,
        "foreign_cores_per_run": records,
    }
    for side in ("hpc_train", "hpc_train_torchrun"):
        result[f"{side}_minus_torchrun_start_s"] = stats(
            [a["start_s"] - b["start_s"] for a, b in zip(runs[side], runs["torchrun"])]
        )
        result[f"{side}_minus_torchrun_ready_s"] = stats(
            [a["ready_s"] - b["ready_s"] for a, b in zip(runs[side], runs["torchrun"])]
        )
        result[f"{side}_minus_torchrun_wall_s"] = stats(
            [a["wall_s"] - b["wall_s"] for a, b in zip(runs[side], runs["torchrun"])]
        )
        for key in ("median_step_ms", "per_step_ms"):
            result[f"{side}_over_torchrun_{key}"] = stats(
                paired_ratios([r[key] for r in runs[side]], [r[key] for r in runs["torchrun"]])
            )
    return result


def rows(result: dict) -> list:
    s = result["sides"]
    out = []
    for side in ("hpc_train", "hpc_train_torchrun"):
        d, r = result[f"{side}_minus_torchrun_start_s"], result[f"{side}_over_torchrun_median_step_ms"]
        out.append(
            row(
                "script start",
                NAMES[side],
                s[side]["start_s"],
                NAMES["torchrun"],
                s["torchrun"]["start_s"],
                f"+{d['median']:.2f} s ({d['min']:.2f}-{d['max']:.2f})",
                "s to the last rank's first line",
            )
        )
        out.append(
            row(
                "script step",
                NAMES[side],
                s[side]["median_step_ms"],
                NAMES["torchrun"],
                s["torchrun"]["median_step_ms"],
                f"ratio {r['median']:.3f} ({r['min']:.3f}-{r['max']:.3f})",
                "ms/step",
                "1.00",
            )
        )
    return out


def run(quick: bool = False, repeats: int = 0, attempts: int = 4) -> dict:
    params = dict(QUICK if quick else FULL)
    if repeats:
        params["repeats"] = repeats
    before = machine_info(busy_seconds=1.0)
    start = time.perf_counter()
    result = measure(attempts=attempts, **params)
    result.update(
        benchmark="script_start",
        mode="quick" if quick else "full",
        machine=before,
        load_after=machine_info()["load_avg_1_5_15"],
        wall_s=time.perf_counter() - start,
    )
    result["table"] = rows(result)
    write_result("script_start", result)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--repeats", type=int, default=0)
    parser.add_argument(
        "--attempts", type=int, default=4, help="tries per run when other processes use the CPUs (1: keep every run)"
    )
    args = parser.parse_args()
    result = run(args.quick, args.repeats, args.attempts)
    columns = [
        ("start_s", "start s", 2),
        ("ready_s", "ready s", 2),
        ("wall_s", "wall s", 2),
        ("median_step_ms", "median ms/step", 3),
        ("per_step_ms", "mean ms/step", 3),
        ("launcher_cpu_s", "launcher CPU s", 2),
        ("launcher_cores_in_steps", "launcher cores in steps", 3),
    ]
    for key, title, digits in columns:
        print(f"\n{title}")
        for side in SIDES:
            print(f"  {NAMES[side]:52s} {fmt_stats(result['sides'][side][key], digits):>24s}")
    for side in ("hpc_train", "hpc_train_torchrun"):
        print(
            f"{NAMES[side]}: start {fmt_stats(result[f'{side}_minus_torchrun_start_s'])} s later than torchrun,"
            f" median step x {fmt_stats(result[f'{side}_over_torchrun_median_step_ms'], 3)},"
            f" mean step x {fmt_stats(result[f'{side}_over_torchrun_per_step_ms'], 3)}"
        )


if __name__ == "__main__":
    main()
