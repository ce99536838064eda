"""FSDP memory on CPU: per-rank parameters + gradients + optimizer state, ddp against fsdp at W = 2 and 4.

Every run starts W fresh worker processes (this script with `--worker`), 1 intra-op thread
each, joined over gloo on a free local port. Each rank builds the same model with the same
seed (`TinyLM`: an embedding, a `nn.ModuleList` of identical MLP blocks Linear d->4d, GELU,
Linear 4d->d, LayerNorm with a residual, and an untied output head; ~50 M parameters, quick
~11 M), wraps it with hpc_train's own strategy objects (`DDPStrategy(...).wrap`,
`FSDPStrategy(...).wrap`: `fully_shard` on each block of the block list that
`shard_units` finds, then on the root, over a 1-D DeviceMesh), and trains with AdamW on random
tokens (per-rank batch x sequence, next-token cross-entropy). After the last optimizer step
(gradients still held) each rank counts:

* parameters, gradients, optimizer state (every tensor in `optimizer.state`): the bytes of
  the storages behind the local tensors (`DTensor.to_local()` for FSDP's sharded ones), each
  storage once (FSDP's sharded gradients are views into one reduce-scatter buffer per unit);
  the local tensors' numel x element_size is recorded beside it;
* the process's resident memory: VmRSS before the model is built (torch, torch.distributed.fsdp
  and hpc_train's strategies imported, process group joined), after building, after wrapping,
  after the first step and at the end; the peak (ru_maxrss); and the peak during the training
  steps alone (VmHWM reset through /proc/self/clear_refs after wrapping).

Diagnostic runs (full mode: one of each case) repeat the memory runs with glibc's
MALLOC_MMAP_THRESHOLD_=131072: every allocation of 128 KiB or more is its own mapping, returned to
the OS when freed, so RSS follows the live tensors instead of what the allocator keeps.

The per-rank figure of a run is the maximum over its ranks. The reference is one plain
PyTorch process (no process group, no wrapping: the "full copy" every ddp rank holds).
Target: fsdp's sharded state <= 1.1 x ddp's state / W at each W.

Step time: at W = 2 ddp and fsdp runs alternate (ddp, fsdp, ddp, fsdp, ...; one pair = one
ddp run and the fsdp run after it), each timing `steps` steps after `warmup` (barrier, then
wall time to the end of the last step, slowest rank). Figure: median of the per-pair ratios
fsdp / ddp ms/step, with their min-max. These runs also give the W = 2 memory figures (the state
is identical in every run; RSS is reported as median (min-max) over the runs).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (
    PYTHON,
    REPO,
    cpu_env,
    fmt_stats,
    foreign_cpu,
    import_root,
    machine_info,
    paired_ratios,
    row,
    stats,
    wait_ranks,
    write_result,
)  # noqa: E402

TARGET = 1.1  # fsdp state <= TARGET x ddp state / W
FULL = {
    "dim": 768,
    "vocab": 8192,
    "layers": 8,
    "batch": 8,
    "seq": 64,
    "pairs": 3,
    "warmup": 2,
    "steps": 4,
    "mem_repeats": 2,
    "mem_warmup": 1,
    "mem_steps": 2,
    "mmap_runs": 1,
}
QUICK = {
    "dim": 352,
    "vocab": 4096,
    "layers": 8,
    "batch": 8,
    "seq": 64,
    "pairs": 2,
    "warmup": 1,
    "steps": 2,
    "mem_repeats": 1,
    "mem_warmup": 1,
    "mem_steps": 1,
    "mmap_runs": 0,
}
MODEL_KEYS = ("dim", "vocab", "layers")
MIB = 1024 * 1024
# glibc: every allocation of 128 KiB or more gets its own mapping, returned to the OS when freed, so
# RSS follows the live tensors instead of what the allocator keeps cached (the diagnostic runs)
MMAP_ENV = {"MALLOC_MMAP_THRESHOLD_": "131072"}


# -- the worker (one rank) ---------------------------------------------------------------
def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


def _maxrss_kib() -> int:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux


def _reset_peak_rss() -> bool:
    try:
        Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM (Linux >= 4.0)
        return True
    except OSError:
        return False


def build_model(dim: int, vocab: int, layers: int):
    import torch.nn as nn

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc1 = nn.Linear(dim, 4 * dim)
            self.act = nn.GELU()
            self.fc2 = nn.Linear(4 * dim, dim)
            self.norm = nn.LayerNorm(dim)

        def forward(self, x):
            return self.norm(x + self.fc2(self.act(self.fc1(x))))

    class TinyLM(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Embedding(vocab, dim)
            self.blocks = nn.ModuleList(Block() for _ in range(layers))
            self.head = nn.Linear(dim, vocab, bias=False)

        def forward(self, tokens):
            h = self.embed(tokens)
            for block in self.blocks:
                h = block(h)
            return self.head(h)

    return TinyLM()


def _local(t):
    """The tensor this rank holds: a DTensor's local shard, else the tensor itself."""
    return t.to_local() if hasattr(t, "to_local") else t


def _count(tensors) -> dict:
    """Bytes of the distinct storages behind the local tensors, and the local tensors' own bytes."""
    storages, numel_bytes, count = {}, 0, 0
    for t in tensors:
        if t is None:
            continue
        local = _local(t)
        numel_bytes += local.numel() * local.element_size()
        storage = local.untyped_storage()
        storages[storage.data_ptr()] = storage.nbytes()
        count += 1
    return {
        "storage_bytes": sum(storages.values()),
        "numel_bytes": numel_bytes,
        "tensors": count,
        "storages": len(storages),
    }


def worker(args: argparse.Namespace) -> None:
    import torch

    torch.set_num_threads(1)
    rss = {"start": _status_kib("VmRSS")}
    import torch.distributed.fsdp  # noqa: F401  imported by every case before the baseline, so the code is not counted as model memory

    from hpc_train.compute.parallel.base import StrategySetup
    from hpc_train.compute.parallel.ddp import DDPSettings, DDPStrategy
    from hpc_train.compute.parallel.fsdp import FSDPSettings, FSDPStrategy
    from hpc_train.compute.parallel.sharding import shard_units
    from hpc_train.compute.runtime import distributed
    from hpc_train.compute.runtime.ranks import RankInfo
    from hpc_train.compute.settings import LayoutSettings

    world, rank = args.world, args.rank
    info = RankInfo(rank, rank, world, world, "127.0.0.1", args.port, "local")
    device = torch.device("cpu")
    distributed.init_process_group(info, "gloo", 600.0, device)  # no-op for one process
    rss["before_model"] = _status_kib("VmRSS")

    torch.manual_seed(0)
    model = build_model(args.dim, args.vocab, args.layers)
    n_params = sum(p.numel() for p in model.parameters())
    rss["after_build"] = _status_kib("VmRSS")
    units = None
    layout = LayoutSettings(
        args.case, 1, world, world, 1, 1, [1, world] if args.case == "fsdp" else None, world, world
    )  # the job's shape, as the launch side lays it out
    if args.case == "fsdp":
        settings = FSDPSettings("fsdp", "auto", replicate=1, reshard_after_forward=True, cpu_offload=False, wrap=None)
        units = len(shard_units(model))
        model = FSDPStrategy(StrategySetup(settings, info, [device], "32", False, None, None, (), layout)).wrap(model)
    elif args.case == "ddp":
        settings = DDPSettings("ddp", "auto", find_unused_parameters=False)
        model = DDPStrategy(StrategySetup(settings, info, [device], "32", False, None, None, (), layout)).wrap(model)
    elif args.case != "plain":
        raise SystemExit(f"unknown case {args.case!r}")
    rss["after_wrap"] = _status_kib("VmRSS")
    peak_before_steps = max(_maxrss_kib(), _status_kib("VmHWM"))
    reset = _reset_peak_rss()

    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    gen = torch.Generator().manual_seed(1000 + rank)
    tokens = torch.randint(0, args.vocab, (args.warmup + args.steps, args.batch, args.seq + 1), generator=gen)
    loss_fn = torch.nn.CrossEntropyLoss()
    barrier = torch.distributed.barrier if world > 1 else (lambda: None)

    def step(i: int) -> float:
        optimizer.zero_grad(set_to_none=True)
        x, y = tokens[i, :, :-1], tokens[i, :, 1:]
        loss = loss_fn(model(x).reshape(-1, args.vocab), y.reshape(-1))
        loss.backward()
        optimizer.step()
        return loss.item()

    for i in range(args.warmup):
        step(i)
        if i == 0:
            rss["after_step1"] = _status_kib("VmRSS")
    barrier()
    start = time.perf_counter()
    for i in range(args.warmup, args.warmup + args.steps):
        last_loss = step(i)
    barrier()
    step_s = (time.perf_counter() - start) / args.steps

    # gradients of the last step are still held (zero_grad runs at the start of a step)
    params = list(model.parameters())
    state = [v for s in optimizer.state.values() for v in s.values() if torch.is_tensor(v)]
    counted = {"params": _count(params), "grads": _count([p.grad for p in params]), "optimizer": _count(state)}
    rss["end"] = _status_kib("VmRSS")
    record = {
        "rank": rank,
        "world": world,
        "case": args.case,
        "model_params": n_params,
        "shard_units": units,
        "param_types": sorted({type(p).__name__ for p in params}),
        "state": counted,
        "state_bytes": sum(c["storage_bytes"] for c in counted.values()),
        "state_numel_bytes": sum(c["numel_bytes"] for c in counted.values()),
        "rss_kib": rss,
        "peak_rss_kib": max(peak_before_steps, _maxrss_kib()),
        "peak_rss_steps_kib": _status_kib("VmHWM") if reset else None,
        "step_s": step_s,
        "last_loss": last_loss,
        "threads": torch.get_num_threads(),
    }
    Path(args.out).write_text(json.dumps(record))
    distributed.teardown()


# -- the driver ----------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(
    case: str,
    world: int,
    params: dict,
    warmup: int,
    steps: int,
    tmp: Path,
    tag: str,
    extra_env: dict = None,
    timeout: float = 900.0,
) -> dict:
    """One run: `world` fresh rank processes; the per-rank records and the per-run summary."""
    port = free_port()
    env = (
        cpu_env(1)
        | (extra_env or {})
        | {"PYTHONPATH": os.pathsep.join(x for x in (str(import_root(REPO)), os.environ.get("PYTHONPATH", "")) if x)}
    )
    outs = [tmp / f"{tag}-rank{r}.json" for r in range(world)]
    model_args = [f"--{k}={params[k]}" for k in (*MODEL_KEYS, "batch", "seq")]

    def run_ranks() -> None:
        procs = [
            subprocess.Popen(
                [
                    PYTHON,
                    str(Path(__file__).resolve()),
                    "--worker",
                    f"--case={case}",
                    f"--world={world}",
                    f"--rank={r}",
                    f"--port={port}",
                    f"--warmup={warmup}",
                    f"--steps={steps}",
                    f"--out={outs[r]}",
                    *model_args,
                ],
                env=env,
                cwd=REPO,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
            for r in range(world)
        ]
        failed = wait_ranks(procs, timeout)
        if failed:
            raise RuntimeError(f"{case} W={world} failed:\n" + "\n".join(failed))

    start = time.perf_counter()
    _, foreign = foreign_cpu(run_ranks)
    ranks = [json.loads(p.read_text()) for p in outs]
    return {
        "case": case,
        "world": world,
        "wall_s": round(time.perf_counter() - start, 2),
        "foreign_cores": foreign,
        "state_bytes": max(r["state_bytes"] for r in ranks),
        "params_bytes": max(r["state"]["params"]["storage_bytes"] for r in ranks),
        "grads_bytes": max(r["state"]["grads"]["storage_bytes"] for r in ranks),
        "optimizer_bytes": max(r["state"]["optimizer"]["storage_bytes"] for r in ranks),
        "rss_before_model_kib": max(r["rss_kib"]["before_model"] for r in ranks),
        "peak_rss_kib": max(r["peak_rss_kib"] for r in ranks),
        "peak_rss_steps_kib": max((r["peak_rss_steps_kib"] or 0) for r in ranks) or None,
        "step_s": max(r["step_s"] for r in ranks),
        "ranks": ranks,
    }


def summarise(runs: list) -> dict:
    """The runs of one case: state (identical in every run), RSS and step time as median (min-max)."""
    first = runs[0]
    mib = lambda key: stats([r[key] / 1024 for r in runs if r[key] is not None])  # noqa: E731  KiB -> MiB
    return {
        "case": first["case"],
        "world": first["world"],
        "runs": len(runs),
        "state_identical": len({r["state_bytes"] for r in runs}) == 1,
        "params_mib": first["params_bytes"] / MIB,
        "grads_mib": first["grads_bytes"] / MIB,
        "optimizer_mib": first["optimizer_bytes"] / MIB,
        "state_mib": first["state_bytes"] / MIB,
        "rss_before_model_mib": mib("rss_before_model_kib"),
        "peak_rss_mib": mib("peak_rss_kib"),
        "peak_rss_steps_mib": mib("peak_rss_steps_kib"),
        "peak_minus_before_mib": stats([(r["peak_rss_kib"] - r["rss_before_model_kib"]) / 1024 for r in runs]),
        "ms_per_step": stats([1000 * r["step_s"] for r in runs]),
        "model_params": first["ranks"][0]["model_params"],
        "shard_units": first["ranks"][0]["shard_units"],
    }


def measure(
    dim: int,
    vocab: int,
    layers: int,
    batch: int,
    seq: int,
    pairs: int,
    warmup: int,
    steps: int,
    mem_repeats: int,
    mem_warmup: int,
    mem_steps: int,
    mmap_runs: int,
    log=print,
) -> dict:
    params = {"dim": dim, "vocab": vocab, "layers": layers, "batch": batch, "seq": seq}
    runs = []
    with tempfile.TemporaryDirectory(prefix="bench-fsdp-") as tmp:

        def go(case: str, world: int, w: int, s: int, tag: str, extra_env: dict = None) -> dict:
            record = launch(case, world, params, w, s, Path(tmp), tag, extra_env)
            record["tag"], record["env"] = tag, extra_env or {}
            runs.append(record)
            log(
                f"  {tag:14s} {case:5s} W={world}: state {record['state_bytes'] / MIB:7.1f} MiB, peak RSS "
                f"{record['peak_rss_kib'] / 1024:7.1f} MiB,"
                f" {1000 * record['step_s']:7.0f} ms/step, other processes {record['foreign_cores']} cores, "
                f"{record['wall_s']:.0f} s"
            )
            return record

        go("plain", 1, mem_warmup, mem_steps, "ref-W1")
        timing = {"ddp": [], "fsdp": []}
        for i in range(pairs):  # ABAB at W = 2
            for case in ("ddp", "fsdp"):
                timing[case].append(go(case, 2, warmup, steps, f"pair{i}-W2"))
        mem4 = {"ddp": [], "fsdp": []}
        for i in range(mem_repeats):
            for case in ("ddp", "fsdp"):
                mem4[case].append(go(case, 4, mem_warmup, mem_steps, f"mem{i}-W4"))
        mmap = {}
        for i in range(mmap_runs):  # diagnostic: RSS without the allocator's cache
            for case, world in (("plain", 1), ("ddp", 2), ("fsdp", 2), ("ddp", 4), ("fsdp", 4)):
                mmap.setdefault(f"{case}_W{world}", []).append(
                    go(case, world, mem_warmup, mem_steps, f"mmap{i}-W{world}", MMAP_ENV)
                )

    ref = summarise([runs[0]])
    cases = {"plain_W1": ref}
    verdict = {}
    for world, group in ((2, timing), (4, mem4)):
        ddp, fsdp = summarise(group["ddp"]), summarise(group["fsdp"])
        cases[f"ddp_W{world}"], cases[f"fsdp_W{world}"] = ddp, fsdp
        bound = TARGET * ddp["state_mib"] / world
        verdict[f"W{world}"] = {
            "fsdp_state_mib": fsdp["state_mib"],
            "ddp_state_mib": ddp["state_mib"],
            "bound_mib": bound,
            "fsdp_x_W_over_ddp": fsdp["state_mib"] * world / ddp["state_mib"],
            "pass": fsdp["state_mib"] <= bound,
        }
    mmap_cases = {key: summarise(group) for key, group in mmap.items()}
    ratio = stats(paired_ratios([r["step_s"] for r in timing["fsdp"]], [r["step_s"] for r in timing["ddp"]]))
    return {
        "config": params
        | {
            "pairs": pairs,
            "warmup": warmup,
            "steps": steps,
            "mem_repeats": mem_repeats,
            "mem_warmup": mem_warmup,
            "mem_steps": mem_steps,
            "threads_per_rank": 1,
            "backend": "gloo",
            "optimizer": "AdamW(lr=1e-4)",
            "precision": "fp32",
            "target": f"fsdp state <= {TARGET} x ddp state / W",
        },
        "cases": cases,
        "cases_mmap_threshold_128k": mmap_cases,
        "target": verdict,
        "step_ratio_fsdp_over_ddp_W2": ratio,
        "runs": runs,
    }


def rows(result: dict) -> list:
    c, ratio = result["cases"], result["step_ratio_fsdp_over_ddp_W2"]
    out = []
    for world in (2, 4):
        v = result["target"][f"W{world}"]
        out.append(
            row(
                "fsdp memory",
                f"fsdp W={world}: params+grads+AdamW state per rank",
                {"median": v["fsdp_state_mib"], "min": v["fsdp_state_mib"], "max": v["fsdp_state_mib"]},
                f"ddp W={world}",
                {"median": v["ddp_state_mib"], "min": v["ddp_state_mib"], "max": v["ddp_state_mib"]},
                f"x W / ddp = {v['fsdp_x_W_over_ddp']:.3f} ({'PASS' if v['pass'] else 'FAIL'})",
                "MiB",
                f"<= {TARGET}",
            )
        )
    out.append(
        row(
            "fsdp memory",
            "fsdp W=2 step time",
            c["fsdp_W2"]["ms_per_step"],
            "ddp W=2 (alternating)",
            c["ddp_W2"]["ms_per_step"],
            f"ratio {fmt_stats(ratio, 3)}",
            "ms/step",
        )
    )
    return out


def print_table(result: dict) -> None:
    c = result["cases"]
    print(
        f"\nmodel: {c['plain_W1']['model_params'] / 1e6:.1f} M parameters, fp32, AdamW; fsdp shard units: "
        f"{c['fsdp_W2']['shard_units']} blocks + root"
    )
    mmap = result.get("cases_mmap_threshold_128k") or {}
    head = (
        f"{'case':6s} {'W':>2s} {'runs':>4s} {'params':>7s} {'grads':>7s} {'optim':>7s} {'state':>7s} "
        f"{'xW/ref':>6s} {'RSS before model':>17s}"
        f" {'peak RSS':>18s} {'peak - before':>15s} {'mmap: peak - before':>20s}"
    )
    print(head + "\n" + "-" * len(head))
    ref = c["plain_W1"]["state_mib"]
    for key in ("plain_W1", "ddp_W2", "fsdp_W2", "ddp_W4", "fsdp_W4"):
        s = c[key]
        m = fmt_stats(mmap[key]["peak_minus_before_mib"], 0) if key in mmap else "-"
        print(
            f"{s['case']:6s} {s['world']:>2d} {s['runs']:>4d} {s['params_mib']:7.1f} {s['grads_mib']:7.1f} "
            f"{s['optimizer_mib']:7.1f} {s['state_mib']:7.1f} {s['state_mib'] * s['world'] / ref:6.3f}"
            f" {fmt_stats(s['rss_before_model_mib'], 0):>17s} {fmt_stats(s['peak_rss_mib'], 0):>18s} "
            f"{fmt_stats(s['peak_minus_before_mib'], 0):>15s} {m:>20s}"
        )
    print(
        "(MiB per rank, max over ranks; RSS median (min-max) over runs; xW/ref = state x W / plain single-process "
        "state;"
        " mmap: runs with MALLOC_MMAP_THRESHOLD_=131072, RSS without glibc's cache of freed blocks)"
    )
    for world in (2, 4):
        v = result["target"][f"W{world}"]
        print(
            f"target W={world}: fsdp {v['fsdp_state_mib']:.1f} MiB <= {TARGET} x ddp {v['ddp_state_mib']:.1f} / "
            f"{world} = {v['bound_mib']:.1f} MiB"
            f" (fsdp x W / ddp = {v['fsdp_x_W_over_ddp']:.3f}): {'PASS' if v['pass'] else 'FAIL'}"
        )
    r = result["step_ratio_fsdp_over_ddp_W2"]
    print(
        f"step time W=2 (1 thread per rank): ddp {fmt_stats(c['ddp_W2']['ms_per_step'], 0)} ms, fsdp "
        f"{fmt_stats(c['fsdp_W2']['ms_per_step'], 0)} ms;"
        f" fsdp/ddp per pair {fmt_stats(r, 3)} over {r['n']} pairs"
    )


def run(quick: bool = False, **overrides) -> dict:
    params = dict(QUICK if quick else FULL) | {
        k: v for k, v in overrides.items() if v is not None and (v or k == "mmap_runs")
    }
    before = machine_info(busy_seconds=1.0)
    uptime = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    start = time.perf_counter()
    result = measure(**params)
    after = machine_info(busy_seconds=1.0)
    result.update(
        benchmark="fsdp_memory",
        mode="quick" if quick else "full",
        machine=before | {"uptime": uptime},
        load_after=after["load_avg_1_5_15"],
        cpu_busy_after=after["cpu_busy_before"],
        wall_s=time.perf_counter() - start,
    )
    result["table"] = rows(result)
    write_result("fsdp_memory", result)  # "mode" says quick or full, as in the other scripts
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="~11 M parameters, fewer runs and steps (< 2 min)")
    parser.add_argument("--pairs", type=int, default=0, help="ddp/fsdp pairs at W=2 (step time)")
    parser.add_argument("--mem-repeats", type=int, default=0, help="runs of each case at W=4")
    parser.add_argument(
        "--mmap-runs",
        type=int,
        default=-1,
        help="diagnostic runs of every case with MALLOC_MMAP_THRESHOLD_=131072 (full: 1, quick: 0)",
    )
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    for name in ("case", "out"):
        parser.add_argument(f"--{name}", help=argparse.SUPPRESS)
    for name in ("world", "rank", "port", "warmup", "steps", *MODEL_KEYS, "batch", "seq"):
        parser.add_argument(f"--{name}", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return
    result = run(
        args.quick,
        pairs=args.pairs,
        mem_repeats=args.mem_repeats,
        mmap_runs=args.mmap_runs if args.mmap_runs >= 0 else None,
    )
    print_table(result)
    print(f"{result['wall_s']:.0f} s; {result['mode']} run; results in benchmarks/results/fsdp_memory.json")


if __name__ == "__main__":
    main()
