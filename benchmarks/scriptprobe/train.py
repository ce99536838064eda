import time

FIRST_LINE = time.time()  # the script's first line: what benchmarks/script_start.py times the start up to

# A torchrun-style DDP script that times itself (benchmarks/script_start.py runs it under hpc-train and torchrun).
# Each rank writes rank<R>.json to --out: the wall-clock time of its first line (above, before any import),
# of the end of `import torch`, of the end of init_process_group (the rendezvous done) and of the end of the
# run, its CPU time and its launcher's during the timed steps, and the duration of each of --warmup + --steps steps
# of a small DDP loop (a 3-layer MLP, gloo, SGD).
# Rank 0 prints the per-step time of the steps after the warm-up.

import argparse  # noqa: E402
import gc  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import resource  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.nn.parallel import DistributedDataParallel  # noqa: E402


def ancestors_cpu() -> dict:
    """CPU seconds so far of each process between this rank and the benchmark (HPC_BENCH_ROOT_PID): the launcher's."""
    root, pid, cpu = int(os.environ.get("HPC_BENCH_ROOT_PID") or 1), os.getppid(), {}
    while pid > 1 and pid != root:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            break
        cpu[str(pid)] = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime
        pid = int(fields[1])
    return cpu


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--batch", type=int, default=32)
    args = parser.parse_args()
    imported = time.time()
    dist.init_process_group("gloo")
    ready = time.time()
    rank = dist.get_rank()
    torch.manual_seed(0)
    w = args.width
    model = DistributedDataParallel(
        torch.nn.Sequential(
            torch.nn.Linear(w, w), torch.nn.ReLU(), torch.nn.Linear(w, w), torch.nn.ReLU(), torch.nn.Linear(w, 1)
        )
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    data = torch.Generator().manual_seed(rank)
    x, y = torch.randn(args.batch, w, generator=data), torch.randn(args.batch, 1, generator=data)
    steps = []
    for i in range(args.warmup + args.steps):
        if i == args.warmup:
            window_cpu = ancestors_cpu()
        begin = time.perf_counter()
        loss = torch.nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        steps.append(time.perf_counter() - begin)
    window_cpu = {pid: cpu - window_cpu[pid] for pid, cpu in ancestors_cpu().items() if pid in window_cpu}
    timed = steps[args.warmup :]
    record = {
        "rank": rank,
        "first_line": FIRST_LINE,
        "imported": imported,
        "ready": ready,
        "end": time.time(),
        "step_s": steps,
        "per_step_s": sum(timed) / len(timed),
        "median_step_s": sorted(timed)[len(timed) // 2],
        "window_s": sum(timed),
        "launcher_window_cpu_s": window_cpu,  # per ancestor process: CPU it used while this rank ran its timed steps
        "cpu_s": sum(resource.getrusage(resource.RUSAGE_SELF)[:2]),  # this rank's own CPU time (user + system)
        "torch_threads": torch.get_num_threads(),
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
        "under_hpc_train": "HPC_TRAIN_RUN_DIR" in os.environ,
        "torchelastic": "TORCHELASTIC_RUN_ID" in os.environ,
    }
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / f"rank{rank}.json").write_text(json.dumps(record))
    if rank == 0:
        print(f"per-step {1000 * record['per_step_s']:.3f} ms over {args.steps} steps", flush=True)
    # DDP's reducer sits in a reference cycle: free it before the group goes, else gloo aborts at exit
    # ("terminate called without an active exception") in about 1 run of 5 with torch 2.14 on this VM.
    del model, optimizer
    gc.collect()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
