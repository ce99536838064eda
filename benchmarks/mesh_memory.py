"""Mesh memory on CPU: per-rank parameters + gradients + AdamW state, peak RSS and step time of
`strategy=mesh` layouts on the same 4 ranks: fsdp (dp_shard 4) against tp 2 x dp_shard 2 and pp 2 x dp_shard 2.

Method as fsdp_memory.py's, whose per-rank counting it reuses. Every run starts 4 fresh worker
processes (this script with `--worker`), 1 intra-op thread each, joined over gloo on a free local
port. Each rank builds the same model with the same seed: the Llama-style decoder of
examples/llama_project (`llama.model.Transformer`: token and position embeddings, RMSNorm, separate
wq/wk/wv/wo, SwiGLU w1/w2/w3, an untied output head), and wraps it with hpc_train's own
`MeshStrategy(StrategySetup(..., layout)).wrap(model, example)`, the layout's `mesh` being the
case's pp x dp_replicate x dp_shard x tp:

* fsdp:  1 x 1 x 4 x 1, FSDP2 over 4 ranks (each block, then the root);
* tp2:   1 x 1 x 2 x 2, the Llama example's tensor-parallel plan (wq/wk/wv/w1/w3 colwise, wo/w2
         rowwise, output colwise_gather, tok_embeddings rowwise), then FSDP2 over dp_shard 2;
* pp2:   2 x 1 x 2 x 1, the model cut between its blocks into 2 stages (balance=params), each stage
         FSDP2 over dp_shard 2, GPipe with 4 micro-batches.

Every case trains on the same global batch (`batch` sequences of `seq` tokens, split over the
data-parallel ranks; a tp group and the stages of one pipeline read the same one) with
`strategy.forward_backward` (the trainer's call) and AdamW, the loss the example's next-token
cross-entropy. After the last optimizer step (gradients still held) each rank counts the storages
behind its local tensors (DTensor.to_local()) of parameters, gradients and optimizer state, and its
peak RSS (ru_maxrss). The ideal is the plain single process's state / 4 (one run, no process group).

Step time: rounds of fsdp, tp2, pp2 runs back to back; each times `steps` steps after `warmup`
(barrier, then wall time to the end of the last step, slowest rank). Figure: median (min-max) over
the rounds of each case's ms/step over the same round's fsdp. 4 ranks on 2 cores: oversubscribed.
"""

from __future__ import annotations

import argparse
import json
import os
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
from fsdp_memory import MIB, _count, _maxrss_kib, _reset_peak_rss, _status_kib, free_port  # noqa: E402

LLAMA_PROJECT = REPO / "examples" / "llama_project"  # the user's package `llama` lives here
WORLD = 4
CASES = {  # name -> (pp, dp_replicate, dp_shard, tp), hpc_train.contracts.mesh_dims.ORDER
    "fsdp": (1, 1, 4, 1),
    "tp2": (1, 1, 2, 2),
    "pp2": (2, 1, 2, 1),
}
TP_PLAN = {
    "tok_embeddings": "rowwise",
    "layers.*.attention.wq": "colwise",
    "layers.*.attention.wk": "colwise",
    "layers.*.attention.wv": "colwise",
    "layers.*.attention.wo": "rowwise",
    "layers.*.feed_forward.w1": "colwise",
    "layers.*.feed_forward.w3": "colwise",
    "layers.*.feed_forward.w2": "rowwise",
    "output": "colwise_gather",
}
PIPELINE = {"chunks": 4, "balance": "params", "schedule": "gpipe"}
FULL = {
    "dim": 256,
    "vocab": 4096,
    "layers": 4,
    "heads": 8,
    "hidden": 704,
    "batch": 16,
    "seq": 64,
    "rounds": 3,
    "warmup": 2,
    "steps": 6,
}
QUICK = FULL | {"rounds": 1, "warmup": 1, "steps": 3}
MODEL_KEYS = ("dim", "vocab", "layers", "heads", "hidden", "batch", "seq")


# -- the worker (one rank) ---------------------------------------------------------------
def build_model(args: argparse.Namespace):
    from llama.model import Transformer

    return Transformer(args.vocab, args.dim, args.layers, args.heads, args.hidden, max_seq_len=args.seq)


def layout_settings(dims: tuple, world: int):
    from hpc_train.compute.settings import LayoutSettings
    from hpc_train.contracts.mesh_dims import MeshDims

    mesh = MeshDims(*dims)
    return LayoutSettings(
        strategy="mesh",
        nodes=1,
        tasks_per_node=world,
        gpus_per_node=world,
        gpus_per_task=1,
        cpus_per_task=1,
        mesh=list(dims),
        world_size=world,
        data_parallel_size=mesh.data_parallel_size,
    )


def worker(args: argparse.Namespace) -> None:
    import torch

    torch.set_num_threads(1)
    sys.path.insert(0, str(LLAMA_PROJECT))
    import torch.distributed.fsdp  # noqa: F401,E401  code, not model memory
    import torch.distributed.pipelining
    import torch.distributed.tensor.parallel
    from llama.loss import next_token_loss

    from hpc_train.compute.runtime import distributed
    from hpc_train.compute.runtime.ranks import RankInfo

    world, rank = args.world, args.rank
    info = RankInfo(rank, rank, world, world, "127.0.0.1", args.port, "local")
    device = torch.device("cpu")
    distributed.init_process_group(info, "gloo", 600.0, device)  # no-op for one process
    rss = {"before_model": _status_kib("VmRSS")}
    torch.manual_seed(0)
    model = build_model(args)
    n_params = sum(p.numel() for p in model.parameters())
    gen = torch.Generator().manual_seed(1000)
    tokens = torch.randint(0, args.vocab, (args.warmup + args.steps, args.batch, args.seq + 1), generator=gen)
    if args.case == "plain":
        strategy, shard, shards = None, 0, 1

        def forward_backward(batch):
            loss = next_token_loss(model(batch[0]), batch[1])
            loss.backward()
            return loss.detach()
    else:
        from hpc_train.compute.parallel.base import StrategySetup
        from hpc_train.compute.parallel.mesh import MeshSettings, MeshStrategy

        dims = CASES[args.case]
        settings = MeshSettings(
            "mesh",
            "auto",
            dp_replicate=dims[1],
            dp_shard=dims[2],
            tp=dims[3],
            pp=dims[0],
            tp_plan=TP_PLAN if dims[3] > 1 else None,
            split_points=None,
            **PIPELINE,
        )
        setup = StrategySetup(
            settings, info, [device], "32", False, next_token_loss, None, (), layout_settings(dims, world)
        )
        strategy = MeshStrategy(setup)
        shard, shards = strategy.data_parallel_rank, strategy.data_parallel_size
    per_rank = args.batch // shards
    tokens = tokens[:, shard * per_rank : (shard + 1) * per_rank]  # the data-parallel coordinate's share of the batch
    rss["after_build"] = _status_kib("VmRSS")
    if strategy is not None:
        model = strategy.wrap(model, tokens[0, :, :-1])
        forward_backward = lambda batch: strategy.forward_backward(model, batch, None)  # noqa: E731
    rss["after_wrap"] = _status_kib("VmRSS")
    reset = _reset_peak_rss()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    barrier = torch.distributed.barrier if world > 1 else (lambda: None)

    def step(i: int) -> torch.Tensor:
        optimizer.zero_grad(set_to_none=True)
        loss = forward_backward((tokens[i, :, :-1], tokens[i, :, 1:]))
        optimizer.step()
        return loss[0] if isinstance(loss, tuple) else loss

    for i in range(args.warmup):
        step(i)
    barrier()
    start = time.perf_counter()
    for i in range(args.warmup, args.warmup + args.steps):
        last_loss = step(i)
    barrier()
    step_s = (time.perf_counter() - start) / args.steps
    # the last step's loss over the global batch: every case trains the same model on the same batches
    global_loss = float(last_loss) if strategy is None else strategy.global_loss(last_loss)

    params = list(model.parameters())  # a pp rank: its stage's
    state = [v for s in optimizer.state.values() for v in s.values() if torch.is_tensor(v)]
    counted = {"params": _count(params), "grads": _count([p.grad for p in params]), "optimizer": _count(state)}
    record = {
        "rank": rank,
        "case": args.case,
        "coordinates": strategy.at if strategy is not None else None,
        "model_params": n_params,
        "local_param_elements": sum(_local_numel(p) for p in params),
        "param_types": sorted({type(p).__name__ for p in params}),
        "state": counted,
        "state_bytes": sum(c["storage_bytes"] for c in counted.values()),
        "state_numel_bytes": sum(c["numel_bytes"] for c in counted.values()),
        "rss_kib": rss,
        "peak_rss_kib": _maxrss_kib(),
        "peak_rss_steps_kib": _status_kib("VmHWM") if reset else None,
        "step_s": step_s,
        "last_loss": global_loss,
        "per_rank_batch": per_rank,
    }
    Path(args.out).write_text(json.dumps(record))
    distributed.teardown()


def _local_numel(t) -> int:
    return (t.to_local() if hasattr(t, "to_local") else t).numel()


# -- the driver ----------------------------------------------------------------------------
def launch(case: str, params: dict, tmp: Path, tag: str, timeout: float = 900.0) -> dict:
    """One run of `case`: its ranks' records and the per-run summary (max over ranks)."""
    world = 1 if case == "plain" else WORLD
    port = free_port()
    path = os.pathsep.join(x for x in (str(import_root(REPO)), os.environ.get("PYTHONPATH", "")) if x)
    env = cpu_env(1) | {"PYTHONPATH": path}
    outs = [tmp / f"{tag}-{case}-rank{r}.json" for r in range(world)]
    model_args = [f"--{k}={params[k]}" for k in (*MODEL_KEYS, "warmup", "steps")]

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
            raise RuntimeError(f"{case} failed:\n" + "\n".join(failed))

    start = time.perf_counter()
    _, foreign = foreign_cpu(run_ranks)
    ranks = [json.loads(p.read_text()) for p in outs]
    return {
        "case": case,
        "tag": tag,
        "world": world,
        "wall_s": round(time.perf_counter() - start, 2),
        "foreign_cores": foreign,
        "state_bytes": [r["state_bytes"] for r in ranks],
        "peak_rss_kib": [r["peak_rss_kib"] for r in ranks],
        "step_s": max(r["step_s"] for r in ranks),
        "last_loss": ranks[0]["last_loss"],
        "ranks": ranks,
    }


def summarise(runs: list, ideal_bytes: float) -> dict:
    """One case over its runs: per-rank state (identical in every run), peak RSS and ms/step."""
    first = runs[0]
    part = lambda key: [r["state"][key]["storage_bytes"] / MIB for r in first["ranks"]]  # noqa: E731
    state = [b / MIB for b in first["state_bytes"]]
    return {
        "case": first["case"],
        "mesh_pp_dpr_dps_tp": CASES.get(first["case"]),
        "runs": len(runs),
        "state_identical": len({tuple(r["state_bytes"]) for r in runs}) == 1,
        "params_mib_per_rank": part("params"),
        "grads_mib_per_rank": part("grads"),
        "optimizer_mib_per_rank": part("optimizer"),
        "state_mib_per_rank": state,
        "state_mib_max": max(state),
        "state_max_over_ideal": max(state) * MIB / ideal_bytes,
        "peak_rss_mib_max": stats([max(r["peak_rss_kib"]) / 1024 for r in runs]),
        "peak_minus_before_mib_max": stats(
            [max(k["peak_rss_kib"] - k["rss_kib"]["before_model"] for k in r["ranks"]) / 1024 for r in runs]
        ),
        "peak_rss_mib_per_rank_first_run": [k / 1024 for k in first["peak_rss_kib"]],
        "rss_before_model_mib_max": max(r["rss_kib"]["before_model"] for r in first["ranks"]) / 1024,
        "ms_per_step": stats([1000 * r["step_s"] for r in runs]),
        "last_loss": [r["last_loss"] for r in runs],
        "per_rank_batch": first["ranks"][0]["per_rank_batch"],
        "param_types": first["ranks"][0]["param_types"],
    }


def measure(
    dim: int,
    vocab: int,
    layers: int,
    heads: int,
    hidden: int,
    batch: int,
    seq: int,
    rounds: int,
    warmup: int,
    steps: int,
    log=print,
) -> dict:
    params = {
        "dim": dim,
        "vocab": vocab,
        "layers": layers,
        "heads": heads,
        "hidden": hidden,
        "batch": batch,
        "seq": seq,
        "warmup": warmup,
        "steps": steps,
    }
    runs = []
    with tempfile.TemporaryDirectory(prefix="bench-mesh-") as tmp:

        def go(case: str, tag: str, p: dict) -> dict:
            record = launch(case, p, Path(tmp), tag)
            runs.append(record)
            log(
                f"  {tag:7s} {case:5s}: state max {max(record['state_bytes']) / MIB:6.1f} MiB, peak RSS max "
                f"{max(record['peak_rss_kib']) / 1024:6.0f} MiB,"
                f" {1000 * record['step_s']:6.0f} ms/step, last loss {record['last_loss']:.5f}, other processes "
                f"{record['foreign_cores']} cores, {record['wall_s']:.0f} s"
            )
            return record

        ref = go("plain", "ref", params)
        timed = {case: [] for case in CASES}
        for i in range(rounds):
            for case in CASES:
                timed[case].append(go(case, f"round{i}", params))

    ref_state = ref["state_bytes"][0]
    ideal = ref_state / WORLD
    cases = {case: summarise(group, ideal) for case, group in timed.items()}
    fsdp_steps = [r["step_s"] for r in timed["fsdp"]]
    ratios = {
        case: stats(paired_ratios([r["step_s"] for r in timed[case]], fsdp_steps)) for case in CASES if case != "fsdp"
    }
    return {
        "config": params
        | {
            "rounds": rounds,
            "world": WORLD,
            "threads_per_rank": 1,
            "backend": "gloo",
            "optimizer": "AdamW(lr=1e-4)",
            "precision": "fp32",
            "tp_plan": TP_PLAN,
            "pipeline": PIPELINE,
            "model": "examples/llama_project llama.model.Transformer",
            "fsdp_case": "strategy=mesh, dp_shard=4",
        },
        "plain_W1": {
            "model_params": ref["ranks"][0]["model_params"],
            "state_mib": ref_state / MIB,
            "peak_rss_mib": ref["peak_rss_kib"][0] / 1024,
            "rss_before_model_mib": ref["ranks"][0]["rss_kib"]["before_model"] / 1024,
            "params_mib": ref["ranks"][0]["state"]["params"]["storage_bytes"] / MIB,
        },
        "ideal_state_mib_per_rank": ideal / MIB,
        "cases": cases,
        "step_ratio_over_fsdp": ratios,
        "runs": runs,
    }


def rows(result: dict) -> list:
    c, ideal = result["cases"], result["ideal_state_mib_per_rank"]
    out = []
    for case in CASES:
        s = c[case]
        out.append(
            row(
                "mesh memory",
                f"{case}: params+grads+AdamW per rank (max)",
                {"median": s["state_mib_max"], "min": min(s["state_mib_per_rank"]), "max": s["state_mib_max"]},
                "plain state / 4",
                {"median": ideal, "min": ideal, "max": ideal},
                f"x ideal {s['state_max_over_ideal']:.3f}",
                "MiB",
            )
        )
    for case, ratio in result["step_ratio_over_fsdp"].items():
        out.append(
            row(
                "mesh memory",
                f"{case} step time (4 ranks, 2 cores)",
                c[case]["ms_per_step"],
                "fsdp (mesh dp_shard 4), same rounds",
                c["fsdp"]["ms_per_step"],
                f"ratio {fmt_stats(ratio, 2)}",
                "ms/step",
            )
        )
    return out


def print_table(result: dict) -> None:
    ref, c = result["plain_W1"], result["cases"]
    print(
        f"\nmodel: {ref['model_params'] / 1e6:.2f} M parameters, fp32, AdamW; plain state {ref['state_mib']:.1f} "
        f"MiB; ideal per rank (/4) {result['ideal_state_mib_per_rank']:.2f} MiB"
    )
    head = (
        f"{'case':5s} {'state per rank (MiB)':>28s} {'max/ideal':>9s} {'peak RSS max (MiB)':>20s}"
        f" {'peak - before':>16s} {'ms/step':>18s} {'/ fsdp':>16s}"
    )
    print(head + "\n" + "-" * len(head))
    for case in CASES:
        s = c[case]
        ratio = fmt_stats(result["step_ratio_over_fsdp"].get(case), 2) if case != "fsdp" else "1"
        print(
            f"{case:5s} {' / '.join(f'{x:.2f}' for x in s['state_mib_per_rank']):>28s} "
            f"{s['state_max_over_ideal']:9.3f} {fmt_stats(s['peak_rss_mib_max'], 0):>20s} "
            f"{fmt_stats(s['peak_minus_before_mib_max'], 0):>16s}"
            f" {fmt_stats(s['ms_per_step'], 0):>18s} {ratio:>16s}"
        )


def run(quick: bool = False, rounds: int = 0) -> dict:
    params = dict(QUICK if quick else FULL) | ({"rounds": rounds} if rounds else {})
    before = machine_info(busy_seconds=1.0)
    uptime = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    start = time.perf_counter()
    result = measure(**params)
    after = machine_info(busy_seconds=1.0)
    result.update(
        benchmark="mesh_memory",
        mode="quick" if quick else "full",
        machine=before | {"uptime": uptime},
        load_after=after["load_avg_1_5_15"],
        cpu_busy_after=after["cpu_busy_before"],
        wall_s=time.perf_counter() - start,
    )
    result["table"] = rows(result)
    write_result("mesh_memory", result)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="one round of 3 timed steps")
    parser.add_argument("--rounds", type=int, default=0, help="rounds of fsdp, tp2, pp2 runs (full: 3)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    for name in ("case", "out"):
        parser.add_argument(f"--{name}", help=argparse.SUPPRESS)
    for name in ("world", "rank", "port", "warmup", "steps", *MODEL_KEYS):
        parser.add_argument(f"--{name}", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return
    result = run(args.quick, args.rounds)
    print_table(result)
    print(f"{result['wall_s']:.0f} s; {result['mode']} run; results in benchmarks/results/mesh_memory.json")


if __name__ == "__main__":
    main()
