"""strategy=auto against brute force on 8 CPU gloo ranks: is the layout it picks within 15 % of the fastest that fits?

Method, in one run of this script:

1. Calibration, once: the cost model's two rates measured on this machine as the ranks will see it. Compute: 8
   worker processes at once (1 thread each, as hpc-train's CPU ranks), each timing float32 matrix products of the
   model's width for ``--calibrate-s`` seconds; the rate is the median worker's FLOP/s (every worker shares the
   cores, as the 8 ranks do). Communication: 8 gloo ranks all-reduce a 4-byte and a 16 MiB tensor ``--reduces``
   times each; the latency is the small one's median time, the bandwidth the ring's bytes a rank sends,
   2 (n - 1) / n x 16 MiB, over the large one's median time less the latency.
2. ``hpc-train strategy=auto`` on the Llama example (``strategy.mesh=llama_tp``, every kind of layout) with those
   rates (``cluster.cpu_gflops``, ``cluster.interconnect={intra: B, inter: B}``): it estimates every candidate,
   ranks those that fit, runs the first, and writes ``layout_choice.json`` (every layout, its modelled step).
3. Brute force: every layout that fits runs for ``--steps`` steps (``trainer.throughput_warmup_steps`` not timed);
   its measured step is summary.json's ``step_time_s`` (the slowest rank's mean over the timed steps). The pick's
   own run is the auto run's.
4. The figure: the pick's measured step over the fastest measured step (goal: at most 1.15), and the rank
   correlation of modelled and measured steps.

Results go to benchmarks/results/auto_layout.json; docs/benchmarks.md records them.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import REPO, cpu_env, hpc_train_cmd, machine_info, run_checked, write_result  # noqa: E402

PROJECT = REPO / "examples" / "llama_project"
WORLD = 8
MODEL = ["model=llama_tiny", "model.dim=256", "model.hidden_dim=1024", "model.n_layers=4", "model.n_heads=8"]
JOB = [
    "--config-dir",
    "conf",
    *MODEL,
    "data=herd_log",
    "data.seq_len=64",
    "trainer=llama",
    "trainer.batch_size=32",
    "trainer.progress=false",
    f"resources.gpus_per_node={WORLD}",
]
REDUCE_BYTES = 16 * 2**20


def _matmul_worker(width: int, seconds: float, out: Any) -> None:
    import torch  # the calibration's workers only

    torch.set_num_threads(1)
    a, b = torch.randn(512, width), torch.randn(width, 4 * width)
    done, started = 0, time.perf_counter()
    while time.perf_counter() - started < seconds:
        a @ b
        done += 1
    out.put(2 * 512 * width * 4 * width * done / (time.perf_counter() - started))


def _reduce_worker(rank: int, store: str, reduces: int, out: Any) -> None:
    import torch  # the calibration's workers only
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=WORLD)
    times: Dict[int, List[float]] = {}
    for size in (1, REDUCE_BYTES // 4):
        tensor = torch.ones(size)
        dist.all_reduce(tensor)
        for _ in range(reduces):
            dist.barrier()
            started = time.perf_counter()
            dist.all_reduce(tensor)
            times.setdefault(size, []).append(time.perf_counter() - started)
    dist.destroy_process_group()
    if rank == 0:
        out.put({size: statistics.median(spent) for size, spent in times.items()})


def calibrate(width: int, seconds: float, reduces: int) -> Dict[str, float]:
    """A worker's GFLOP/s with 8 at once; a rank's all-reduce GB/s over gloo with 8 ranks (16 MiB, less the latency)
    and the latency (a 4-byte all-reduce's time), measured here."""
    context = mp.get_context("spawn")
    out = context.Queue()
    workers = [context.Process(target=_matmul_worker, args=(width, seconds, out)) for _ in range(WORLD)]
    for worker in workers:
        worker.start()
    rates = [out.get() for _ in workers]
    for worker in workers:
        worker.join()
    with tempfile.TemporaryDirectory() as folder:
        store = str(Path(folder) / "store")
        ranks = [context.Process(target=_reduce_worker, args=(r, store, reduces, out)) for r in range(WORLD)]
        for rank in ranks:
            rank.start()
        reduce_s = out.get()
        for rank in ranks:
            rank.join()
    sent = 2 * (WORLD - 1) / WORLD * REDUCE_BYTES
    latency = reduce_s[1]
    bandwidth = sent / (reduce_s[REDUCE_BYTES // 4] - latency) / 1e9
    return {"cpu_gflops": statistics.median(rates) / 1e9, "gloo_gb_per_s": bandwidth, "gloo_latency_us": latency * 1e6}


def run_layout(overrides: List[str], run_dir: Path, steps: int, warmup: int) -> Dict[str, Any]:
    command = hpc_train_cmd(
        [*JOB, *overrides, f"trainer.max_steps={steps}", f"trainer.throughput_warmup_steps={warmup}"]
    )
    started = time.perf_counter()
    proc = run_checked([*command, f"hydra.run.dir={run_dir}"], env=cpu_env(1), cwd=PROJECT, timeout=1800)
    summary = json.loads((run_dir / "summary.json").read_text())
    return {"step_s": summary["step_time_s"], "wall_s": time.perf_counter() - started, "stdout": proc.stdout[-400:]}


def rank_correlation(first: List[float], second: List[float]) -> float:
    """Spearman's rank correlation of two lists (no ties expected)."""

    def ranks(values: List[float]) -> List[int]:
        order = sorted(range(len(values)), key=values.__getitem__)
        return [order.index(index) for index in range(len(values))]

    a, b, n = ranks(first), ranks(second), len(first)
    return 1 - 6 * sum((x - y) ** 2 for x, y in zip(a, b)) / (n * (n * n - 1)) if n > 1 else 1.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--warmup", type=int, default=4)
    parser.add_argument("--calibrate-s", type=float, default=4.0)
    parser.add_argument("--reduces", type=int, default=10)
    parser.add_argument("--search", default="[ddp,fsdp,tp,pp]")
    args = parser.parse_args()
    rates = calibrate(256, args.calibrate_s, args.reduces)
    print(f"calibrated: {rates}", flush=True)
    bandwidth, latency = f"{rates['gloo_gb_per_s']:.4g}", f"{rates['gloo_latency_us']:.4g}"
    auto = [
        "strategy=auto",
        "strategy.mesh=llama_tp",
        f"strategy.search={args.search}",
        f"cluster.cpu_gflops={rates['cpu_gflops']:.4g}",
        f"cluster.interconnect={{intra:{bandwidth},inter:{bandwidth},intra_latency_us:{latency},inter_latency_us:{latency}}}",
    ]
    root = Path(tempfile.mkdtemp(prefix="auto-layout-"))
    picked = run_layout(auto, root / "auto", args.steps, args.warmup)
    choice = json.loads((root / "auto" / "layout_choice.json").read_text())
    measured = {choice["chosen"]["layout"]: picked["step_s"]}
    for number, row in enumerate(r for r in choice["layouts"] if "refused" not in r):
        name = row["layout"]
        if name not in measured:
            measured[name] = run_layout(row["overrides"], root / f"run{number}", args.steps, args.warmup)["step_s"]
        print(f"{name}: modelled {row['step_s'] * 1e3:.1f} ms, measured {measured[name] * 1e3:.1f} ms", flush=True)
    modelled = {row["layout"]: row["step_s"] for row in choice["layouts"] if "refused" not in row}
    fastest = min(measured, key=measured.__getitem__)
    ratio = measured[choice["chosen"]["layout"]] / measured[fastest]
    record = {
        "machine": machine_info(),
        "calibration": rates,
        "args": vars(args),
        "choice": choice,
        "measured_step_s": measured,
        "picked": choice["chosen"]["layout"],
        "fastest": fastest,
        "picked_over_fastest": ratio,
        "rank_correlation": rank_correlation([modelled[name] for name in measured], list(measured.values())),
        "within_15_percent": ratio <= 1.15,
    }
    print(f"picked {record['picked']}, fastest {fastest}: {ratio:.3f}x", flush=True)
    print(f"written {write_result('auto_layout', record)}")


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
