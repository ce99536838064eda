"""The bound a 2-stage pipeline can reach on this machine, from measured parts.

Two processes (gloo, this machine, 1 intra-op thread each, exactly like the pipelining engine's
two ranks) build the model, cut it with hpc-train's own splitter (`staged_model.split_model`, the same
split as the engine runs) and measure, for every number of micro-batches M:

* each stage's forward and backward time per micro-batch (batch / M samples; the last stage's
  forward includes the loss), twice: **alone** (the other process waits, its core idle) and
  **together** (both processes compute their own stage at the same time, as they do inside a
  pipeline on 2 cores);
* one activation transfer: the tensors the first stage sends the second for one micro-batch, a
  ping-pong with `dist.send`/`dist.recv` over gloo (one way = half the round trip; the gradient
  sent back has the same size);
* the work of a step outside the schedule, per stage and together: fetching the batch from a
  DataLoader (both ranks of the engine read the batch), zero_grad and the SGD step.

From these it builds, for each M, the makespan of the GPipe (fill-drain: all forwards, then all
backwards) and 1F1B schedules, by replaying each stage's operations in the schedule's order
(torch.distributed.pipelining's orders for 2 stages) with a transfer's latency between a
stage's output and its use on the other stage, plus the step's outside work (the slower
stage's). Transfers are counted as latency only, so the bound is optimistic. Two bounds:

* `together`: operations at the speed measured with both cores busy: what a perfect engine
  reaches on this machine (the figure the engine's efficiency is computed against);
* `alone`: operations at single-process speed: two independent cores.

It also reports `sequential_1t`: both stages on the full batch in one process with 1 thread
(forward, backward, step), and the same with 2 threads, the probe's view of the
`model_parallel` reference.

Used by pipeline_efficiency.py; on its own: python benchmarks/pipeline_bound.py --split 6,9
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional, Sequence

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import PYTHON, cpu_env  # noqa: E402

STAGES = 2


# -- the schedules ------------------------------------------------------------------------
def schedule_order(kind: str, stage: int, micro: int, stages: int = STAGES) -> List[tuple]:
    """Operations of one stage in torch.distributed.pipelining's order: ("F", j) / ("B", j)."""
    if kind == "gpipe":
        return [("F", j) for j in range(micro)] + [("B", j) for j in range(micro)]
    if kind == "1f1b":
        warmup = min(micro, stages - stage)  # Schedule1F1B: last stage 1 warm-up forward, first stage `stages`
        order = [("F", j) for j in range(warmup)]
        f, b = warmup, 0
        while b < micro:
            order.append(("B", b))
            b += 1
            if f < micro:
                order.append(("F", f))
                f += 1
        return order
    raise ValueError(kind)


def makespan(kind: str, micro: int, fwd: Sequence[float], bwd: Sequence[float], transfer: float) -> float:
    """Time from the first forward to the last backward, each stage running its operations in order.

    fwd[s], bwd[s]: per-micro-batch times of stage s; transfer: one activation (or gradient) message.
    Stage s's forward of micro-batch j waits for stage s-1's forward of j plus a transfer; its
    backward of j for stage s+1's backward of j plus a transfer (the last stage's for its own forward).
    """
    stages = len(fwd)
    orders = [schedule_order(kind, s, micro, stages) for s in range(stages)]
    done: Dict[tuple, float] = {}
    clock = [0.0] * stages
    position = [0] * stages
    remaining = sum(len(o) for o in orders)
    while remaining:
        progressed = False
        for s in range(stages):
            while position[s] < len(orders[s]):
                op, j = orders[s][position[s]]
                if op == "F":
                    dep = done.get(("F", s - 1, j), None) if s > 0 else 0.0
                    ready = None if dep is None else dep + (transfer if s > 0 else 0.0)
                else:
                    dep = done.get(("B", s + 1, j)) if s < stages - 1 else done.get(("F", s, j))
                    ready = None if dep is None else dep + (transfer if s < stages - 1 else 0.0)
                if ready is None:
                    break
                start = max(clock[s], ready)
                clock[s] = start + (fwd[s] if op == "F" else bwd[s])
                done[(op, s, j)] = clock[s]
                position[s] += 1
                remaining -= 1
                progressed = True
        if not progressed:
            raise RuntimeError("schedule deadlock")
    return max(clock)


def bounds(measured: dict) -> dict:
    """GPipe and 1F1B step-time bounds (seconds) for every M, `together` and `alone`."""
    out = {}
    for m_key, parts in measured["micro"].items():
        m = int(m_key)
        row = {"micro_batch": parts["micro_batch"], "transfer_s": parts["transfer_s"]}
        for speed in ("together", "alone"):
            fwd = [parts[speed][s]["fwd_s"] for s in range(STAGES)]
            bwd = [parts[speed][s]["bwd_s"] for s in range(STAGES)]
            outside = max(measured["outside"][speed][s] for s in range(STAGES))
            for kind in ("gpipe", "1f1b"):
                if kind == "1f1b" and m < STAGES:
                    continue
                row[f"{kind}_{speed}_s"] = makespan(kind, m, fwd, bwd, parts["transfer_s"]) + outside
            row[f"compute_{speed}_s"] = [m * (f + b) for f, b in zip(fwd, bwd)]
        out[m] = row
    return out


# -- the measurement (2 processes) ----------------------------------------------------------
def _median(values: List[float]) -> float:
    return statistics.median(values) if values else float("nan")


def _worker(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist
    import torchvision
    from omegaconf import OmegaConf

    from hpc_train.compute.data.loaders import train_loader
    from hpc_train.compute.parallel.staged_model import split_model
    from hpc_train.compute.parallel.tracing import stage_inputs

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = getattr(torchvision.models, args.model)(weights=None, num_classes=10)
    split = [int(x) for x in args.split.split(",")] if args.split else "params"
    stages = split_model(
        model,
        STAGES,
        split,
        args.split_points.split(",") if args.split_points else None,
        torch.randn(2, 3, args.image_size, args.image_size),
    )
    mine = stages[rank]
    loss_fn = torch.nn.CrossEntropyLoss()
    gen = torch.Generator().manual_seed(1)
    images = torch.randn(
        args.batch * (args.iters + 1), 3, args.image_size, args.image_size, generator=gen
    )  # one batch per timed step
    labels = torch.randint(0, 10, (args.batch * (args.iters + 1),), generator=gen)
    result: dict = {"micro": {}, "split": split, "activation_shapes": {}}

    def fwd_bwd_times(m: int, busy: bool) -> dict:
        """Per-micro-batch forward and backward of this rank's stage, GPipe order, `iters` steps after 1 warm-up."""
        b = args.batch // m
        x = images[:b]
        y = labels[:b]
        act = tuple(v.detach() for v in stage_inputs(stages, 1, x))
        fwd, bwd = [], []
        for it in range(args.iters + 1):
            outs, ins = [], []
            for _ in range(m):
                t0 = time.perf_counter()
                if rank == 0:
                    out = mine(x)
                else:
                    inp = tuple(a.clone().requires_grad_() for a in act)
                    out = loss_fn(mine(*inp).float(), y)
                    ins.append(inp)
                t1 = time.perf_counter()
                outs.append(out)
                if it:
                    fwd.append(t1 - t0)
            for j in range(m):
                t0 = time.perf_counter()
                out = outs[j]
                if rank == 0:
                    outs_t = out if isinstance(out, tuple) else (out,)
                    torch.autograd.backward(outs_t, [torch.ones_like(o) for o in outs_t])
                else:
                    out.backward()
                t1 = time.perf_counter()
                if it:
                    bwd.append(t1 - t0)
            mine.zero_grad(set_to_none=True)
        return {"fwd_s": _median(fwd), "bwd_s": _median(bwd), "fwd_all": fwd, "bwd_all": bwd}

    def both(fn, *a):
        """fn on rank 0 alone, then rank 1 alone (the other waits), then both together."""
        alone = None
        for r in range(STAGES):
            dist.barrier()
            if rank == r:
                alone = fn(*a)
            else:  # how busy the waiting process keeps its core (gloo's barrier should sleep)
                wall, cpu = time.perf_counter(), time.process_time()
            dist.barrier()
            if rank != r:
                result.setdefault("waiting_cpu_fraction", []).append(
                    (time.process_time() - cpu) / max(1e-9, time.perf_counter() - wall)
                )
        dist.barrier()
        together = fn(*a)
        dist.barrier()
        return alone, together

    def gather(value) -> list:
        values = [None] * STAGES
        dist.all_gather_object(values, value)
        return values

    def transfer_time(m: int) -> float:
        b = args.batch // m
        act = [v.detach().contiguous() for v in stage_inputs(stages, 1, images[:b])]
        rtts = []
        for it in range(args.iters * 4 + 2):
            dist.barrier()
            t0 = time.perf_counter()
            for v in act:
                if rank == 0:
                    dist.send(v, 1)
                else:
                    dist.recv(v, 0)
            for v in act:
                if rank == 1:
                    dist.send(v, 0)
                else:
                    dist.recv(v, 1)
            if it >= 2:
                rtts.append(time.perf_counter() - t0)
        result["activation_shapes"][m] = [list(v.shape) for v in act]
        return _median(rtts) / 2

    for m in args.micro:
        alone, together = both(fwd_bwd_times, m, True)
        t = transfer_time(m)
        alone_all, together_all = gather(alone), gather(together)
        result["micro"][m] = {
            "micro_batch": args.batch // m,
            "alone": [{k: v[k] for k in ("fwd_s", "bwd_s")} for v in alone_all],
            "together": [{k: v[k] for k in ("fwd_s", "bwd_s")} for v in together_all],
            "transfer_s": t,
        }

    # the step's work outside the schedule: the batch from a DataLoader, zero_grad, SGD step
    dataset = torch.utils.data.TensorDataset(images, labels)
    optimizer = torch.optim.SGD(mine.parameters(), lr=0.01, momentum=0.9, weight_decay=5e-4)
    for p in mine.parameters():
        p.grad = torch.randn_like(p)

    def outside() -> float:
        loader = train_loader(
            dataset, OmegaConf.create({"num_workers": 0, "pin_memory": False}), args.batch, 1, 0, seed=0
        )
        it, times = iter(loader), []
        for i in range(args.iters + 1):
            t0 = time.perf_counter()
            next(it)
            optimizer.zero_grad(set_to_none=False)
            optimizer.step()
            if i:
                times.append(time.perf_counter() - t0)
        return _median(times)

    alone, together = both(outside)
    result["outside"] = {"alone": gather(alone), "together": gather(together)}

    # the sequential reference: both stages, full batch, one process, 1 then 2 threads (rank 0, rank 1 idle)
    if rank == 0:
        seq = {}
        full_opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, weight_decay=5e-4)
        for threads in (1, 2):
            torch.set_num_threads(threads)
            times = []
            for i in range(args.iters + 1):
                t0 = time.perf_counter()
                full_opt.zero_grad(set_to_none=True)
                carry = images[: args.batch]
                for stage in stages:
                    carry = stage(*carry) if isinstance(carry, tuple) else stage(carry)
                loss_fn(carry, labels[: args.batch]).backward()
                full_opt.step()
                if i:
                    times.append(time.perf_counter() - t0)
            seq[f"sequential_{threads}t_s"] = _median(times)
        torch.set_num_threads(1)
        result.update(seq)
    dist.barrier()
    waiting = gather(result.get("waiting_cpu_fraction", []))
    if rank == 0:
        result["waiting_cpu_fraction"] = max(x for w in waiting for x in w)
        Path(args.out).write_text(json.dumps(result, indent=1))
    dist.destroy_process_group()


def measure(
    model: str = "resnet18",
    image_size: int = 64,
    batch: int = 64,
    split: Optional[Sequence[int]] = None,
    split_points: Optional[Sequence[str]] = None,
    micro=(1, 2, 4, 8),
    iters: int = 5,
    out_dir: Optional[Path] = None,
) -> dict:
    """Run the two measuring processes; return their measurements and the bounds built from them."""
    import socket
    import tempfile

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with tempfile.TemporaryDirectory(prefix="bench-bound-") as tmp:
        out = Path(out_dir or tmp) / "bound.json"
        cmd = [
            PYTHON,
            str(Path(__file__).resolve()),
            "--worker",
            f"--model={model}",
            f"--image-size={image_size}",
            f"--batch={batch}",
            f"--micro={','.join(map(str, micro))}",
            f"--iters={iters}",
            f"--out={out}",
        ]
        if split:
            cmd.append(f"--split={','.join(map(str, split))}")
        if split_points:
            cmd.append(f"--split-points={','.join(split_points)}")
        procs = []
        for rank in range(STAGES):
            env = cpu_env(1) | {
                "RANK": str(rank),
                "WORLD_SIZE": str(STAGES),
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": str(port),
            }
            procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
        outputs = [p.communicate(timeout=1800)[0] for p in procs]
        if any(p.returncode for p in procs):
            raise RuntimeError("pipeline bound probe failed:\n" + "\n".join(o[-3000:] for o in outputs))
        measured = json.loads(out.read_text())
    measured["micro"] = {int(k): v for k, v in measured["micro"].items()}
    measured["bounds"] = bounds(measured)
    measured["config"] = {
        "model": model,
        "image_size": image_size,
        "batch": batch,
        "split": list(split) if split else None,
        "split_points": list(split_points) if split_points else None,
        "iters": iters,
        "threads_per_process": 1,
    }
    return measured


def print_table(measured: dict) -> None:
    ms = lambda x: f"{x * 1000:7.1f}"  # noqa: E731
    print(
        f"sequential (both stages, full batch, 1 process): 1 thread {ms(measured['sequential_1t_s'])} ms, 2 "
        f"threads {ms(measured['sequential_2t_s'])} ms"
    )
    o = measured["outside"]
    print(
        f"outside the schedule per step (fetch + zero_grad + SGD step), stage 0/1: alone {ms(o['alone'][0])} "
        f"{ms(o['alone'][1])}, together {ms(o['together'][0])} {ms(o['together'][1])} ms"
    )
    print(
        f"{'M':>3s} {'mb':>4s} | {'alone f0 b0 f1 b1 (ms)':^32s} | {'together f0 b0 f1 b1 (ms)':^32s} | "
        f"{'xfer':>6s} | {'GPipe bound':>12s} {'1F1B bound':>12s} (together / alone, ms)"
    )
    for m, parts in measured["micro"].items():
        b = measured["bounds"][m]
        a, t = parts["alone"], parts["together"]
        print(
            f"{m:3d} {parts['micro_batch']:4d} | {ms(a[0]['fwd_s'])} {ms(a[0]['bwd_s'])} {ms(a[1]['fwd_s'])} "
            f"{ms(a[1]['bwd_s'])} | "
            f"{ms(t[0]['fwd_s'])} {ms(t[0]['bwd_s'])} {ms(t[1]['fwd_s'])} {ms(t[1]['bwd_s'])} | "
            f"{parts['transfer_s'] * 1000:6.2f} | "
            f"{ms(b['gpipe_together_s'])}/{ms(b['gpipe_alone_s'])} "
            + (f"{ms(b['1f1b_together_s'])}/{ms(b['1f1b_alone_s'])}" if "1f1b_together_s" in b else "-")
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--model", default="resnet18")
    parser.add_argument("--image-size", type=int, default=64)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--split", default="", help="layer counts per stage, e.g. 6,9 (default: balance=params)")
    parser.add_argument("--split-points", default="", help="module names where stage 2 begins (strategy.split_points)")
    parser.add_argument("--micro", default="1,2,4,8")
    parser.add_argument("--iters", type=int, default=5)
    args = parser.parse_args()
    args.micro = [int(x) for x in str(args.micro).split(",")]
    if args.worker:
        _worker(args)
        return
    measured = measure(
        args.model,
        args.image_size,
        args.batch,
        [int(x) for x in args.split.split(",")] if args.split else None,
        args.split_points.split(",") if args.split_points else None,
        tuple(args.micro),
        args.iters,
    )
    print_table(measured)


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
