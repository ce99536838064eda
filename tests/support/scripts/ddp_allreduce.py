"""A torchrun-style DDP script that knows nothing of hpc_train (tests/e2e/test_scripts_dist.py).

Reads its rank from torchrun's variables (``init_process_group("gloo")`` from the environment),
all-reduces a deterministic tensor, trains a tiny model for a few DDP steps on data that differs
per rank, and writes ``rank<RANK>.json`` (its environment, host and results) to
``$HPC_TRAIN_RUN_DIR`` (else ``--out DIR``). Every rank must end with the same all-reduced sum
and the same weights; the test compares them across ranks and launchers.
"""

import argparse
import gc
import json
import os
import socket
import time
from pathlib import Path

START = time.time()  # the benchmark reads "first line" from here (see benchmarks/script_start.py)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.nn.parallel import DistributedDataParallel  # noqa: E402

VARIABLES = (
    "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "NODE_RANK", "MASTER_ADDR", "MASTER_PORT",
    "OMP_NUM_THREADS", "CUDA_VISIBLE_DEVICES", "HPC_TRAIN_RUN_DIR", "HPC_TRAIN_ATTEMPT", "TORCHELASTIC_RUN_ID",
    "SLURM_JOB_ID", "SLURM_PROCID", "SLURM_CPUS_PER_TASK", "GPU_DEVICE_ORDINAL", "SLURM_STEP_GPUS",
)  # fmt: skip


def sleep_for_an_hour() -> None:
    time.sleep(3600)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--out", default=None)
    parser.add_argument("--hang-rank", type=int, default=None, help="this rank sleeps for an hour at --hang-step")
    parser.add_argument("--hang-step", type=int, default=2)
    args = parser.parse_args()
    dist.init_process_group("gloo")  # env:// : MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE
    rank, world = dist.get_rank(), dist.get_world_size()

    value = torch.tensor([float(rank + 1), 10.0**rank])  # sum: W(W+1)/2 and 1 + 10 + ... + 10^(W-1)
    dist.all_reduce(value)

    torch.manual_seed(0)  # the same initial weights on every rank (DDP broadcasts rank 0's anyway)
    model = DistributedDataParallel(torch.nn.Linear(4, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    data = torch.Generator().manual_seed(1000 + rank)  # each rank its own batch: gradients averaged by DDP
    for step in range(1, args.steps + 1):
        x = torch.randn(8, 4, generator=data)
        loss = (model(x) - x.sum(dim=1, keepdim=True)).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if args.hang_rank is not None:  # the hang tests: log the loss over every rank, as scripts do
            if rank == args.hang_rank and step == args.hang_step:
                sleep_for_an_hour()
            logged = loss.detach().clone()
            dist.all_reduce(logged)
            print(f"step {step}: loss {logged.item() / world:.4f}", flush=True)
    weights = [float(v) for p in model.module.parameters() for v in p.detach().flatten()]

    out = Path(args.out or os.environ["HPC_TRAIN_RUN_DIR"])
    out.mkdir(parents=True, exist_ok=True)
    record = {
        "env": {key: os.environ.get(key) for key in VARIABLES},
        "host": socket.gethostname(),
        "rank": rank,
        "world_size": world,
        "all_reduce": value.tolist(),
        "weights": weights,
        "start": START,
        "torch_threads": torch.get_num_threads(),
    }
    (out / f"rank{rank}.json").write_text(json.dumps(record, indent=1))
    print(f"rank {rank}/{world}: all_reduce {value.tolist()} weights {weights}", flush=True)
    # DDP's reducer sits in a reference cycle: free it before the group goes, else gloo aborts at exit
    # ("terminate called without an active exception") in about 1 run of 5 with torch 2.14 on this VM.
    del model, optimizer
    gc.collect()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
