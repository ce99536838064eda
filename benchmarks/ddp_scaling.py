"""DDP weak scaling on CPU: 1 process x 1 thread against 2 processes x 1 thread (gloo).

The per-rank batch is constant (weak scaling): 1 process trains with global batch b, 2 processes
with global batch 2b. Efficiency = throughput(2) / (2 x throughput(1)), 1.0 being perfect.

Two pairs are measured in the same run, alternating, each run a fresh process tree:
* hpc-train: `strategy=ddp resources.gpus_per_node=1` (one process, no process group) and
  `resources.gpus_per_node=2` (the local launcher starts 2 CPU workers, gloo);
* plain PyTorch (benchmarks/plain_train.py): one plain process, and 2 processes started by
  `torchrun --standalone --nproc-per-node 2` running DistributedDataParallel over gloo with a
  DistributedSampler.
Everything else as in the overhead benchmark: ResNet-18, synthetic 64x64 images in a
TensorDataset read through a DataLoader (num_workers=0), SGD, fp32, OMP_NUM_THREADS=1 per rank,
images/s of the global batch after the warm-up steps (hpc-train's definition).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (
    HERE,
    PYTHON,
    cpu_env,
    fmt_stats,
    hpc_train_cmd,
    machine_info,
    read_json,
    row,
    run_checked,
    stats,
    write_result,
)  # noqa: E402

FULL = {"repeats": 5, "steps": 25, "warmup": 5}
QUICK = {"repeats": 2, "steps": 8, "warmup": 2}


def measure(
    repeats: int, steps: int, warmup: int, per_rank_batch: int = 32, image_size: int = 64, model: str = "resnet18"
) -> dict:
    env = cpu_env(1)
    samples = 2 * per_rank_batch * steps  # one epoch for both sizes
    runs = {"hpc1": [], "hpc2": [], "plain1": [], "plain2": []}
    with tempfile.TemporaryDirectory(prefix="bench-ddp-") as tmp:

        def hpc(world: int, i: int) -> float:
            run_dir = Path(tmp) / f"hpc{world}-{i}"
            run_checked(
                hpc_train_cmd(
                    [
                        "strategy=ddp",
                        f"resources.gpus_per_node={world}",
                        f"model={model}",
                        "data=synthetic",
                        f"data.image_size={image_size}",
                        f"data.num_samples={samples}",
                        f"trainer.batch_size={world * per_rank_batch}",
                        f"trainer.max_steps={steps}",
                        "trainer.epochs=null",
                        "trainer.eval=false",
                        f"trainer.throughput_warmup_steps={warmup}",
                        f"hydra.run.dir={run_dir}",
                    ]
                ),
                env=env,
            )
            return read_json(run_dir / "summary.json")["images_per_sec"]

        def plain(world: int, i: int) -> float:
            out = Path(tmp) / f"plain{world}-{i}.json"
            args = [
                f"--model={model}",
                f"--image-size={image_size}",
                f"--num-samples={samples}",
                f"--batch={world * per_rank_batch}",
                f"--steps={steps}",
                f"--warmup={warmup}",
                "--threads=1",
                "--device=cpu",
                f"--out={out}",
            ]
            launcher = (
                [PYTHON, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={world}"]
                if world > 1
                else [PYTHON]
            )
            run_checked([*launcher, str(HERE / "plain_train.py"), *args], env=env)
            return read_json(out)["images_per_sec"]

        for i in range(repeats):
            runs["hpc1"].append(hpc(1, i))
            runs["hpc2"].append(hpc(2, i))
            runs["plain1"].append(plain(1, i))
            runs["plain2"].append(plain(2, i))
    eff = lambda two, one: [t / (2 * o) for t, o in zip(two, one)]  # noqa: E731  paired per round
    return {
        "config": {
            "model": model,
            "image_size": image_size,
            "per_rank_batch": per_rank_batch,
            "steps": steps,
            "warmup": warmup,
            "threads_per_rank": 1,
            "backend": "gloo",
            "repeats": repeats,
        },
        "images_per_sec": {k: stats(v) for k, v in runs.items()},
        "efficiency": {
            "hpc_train": stats(eff(runs["hpc2"], runs["hpc1"])),
            "plain_torch_ddp": stats(eff(runs["plain2"], runs["plain1"])),
        },
    }


def rows(result: dict) -> list:
    if "skipped" in result:
        return [row("ddp scaling", "2 x 1 thread", None, "1 x 1 thread", None, result["skipped"], "images/s")]
    ips, eff = result["images_per_sec"], result["efficiency"]
    e1, e2 = eff["hpc_train"], eff["plain_torch_ddp"]
    return [
        row(
            "ddp scaling",
            "hpc-train ddp, 2 proc x 1 thread",
            ips["hpc2"],
            "hpc-train, 1 proc x 1 thread",
            ips["hpc1"],
            f"efficiency {e1['median']:.2f} ({e1['min']:.2f}-{e1['max']:.2f})",
            "images/s",
        ),
        row(
            "ddp scaling",
            "torchrun + plain DDP, 2 proc x 1 thread",
            ips["plain2"],
            "plain loop, 1 proc x 1 thread",
            ips["plain1"],
            f"efficiency {e2['median']:.2f} ({e2['min']:.2f}-{e2['max']:.2f})",
            "images/s",
        ),
    ]


def run(quick: bool = False, repeats: int = 0) -> dict:
    params = dict(QUICK if quick else FULL)
    if repeats:
        params["repeats"] = repeats
    before = machine_info()
    start = time.perf_counter()
    result = measure(**params)
    result.update(
        benchmark="ddp_scaling",
        mode="quick" if quick else "full",
        machine=before,
        load_after=machine_info()["load_avg_1_5_15"],
        wall_s=time.perf_counter() - start,
    )
    result["table"] = rows(result)
    write_result("ddp_scaling", result)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--repeats", type=int, default=0)
    args = parser.parse_args()
    result = run(args.quick, args.repeats)
    ips, eff = result["images_per_sec"], result["efficiency"]
    print(f"{'run':40s} {'images/s median (min-max)':>28s}")
    for key, name in [
        ("hpc1", "hpc-train 1 x 1 thread"),
        ("hpc2", "hpc-train ddp 2 x 1 thread"),
        ("plain1", "plain loop 1 x 1 thread"),
        ("plain2", "torchrun plain DDP 2 x 1 thread"),
    ]:
        print(f"{name:40s} {fmt_stats(ips[key], 1):>28s}")
    print(
        f"weak-scaling efficiency: hpc-train {fmt_stats(eff['hpc_train'])}, plain torch DDP "
        f"{fmt_stats(eff['plain_torch_ddp'])}"
    )


if __name__ == "__main__":
    main()
