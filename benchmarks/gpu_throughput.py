"""GPU training throughput: ResNet-50, 224x224 synthetic images, bf16 autocast + channels_last,
with and without torch.compile, `hpc-train strategy=single` next to a plain PyTorch loop in the
same run, next to published per-GPU figures. Without a CUDA GPU it writes "not measured (no GPU)".

Rows, each a fresh process, alternating within a round (median and min-max over `--repeats`):
* `hpc-train strategy=single model=resnet50 data=synthetic data.image_size=224
  trainer.precision=bf16 trainer.channels_last=true [trainer.compile=true]` with
  `data.num_workers=--workers data.pin_memory=true`. hpc-train's synthetic data are CPU tensors
  read through a DataLoader and copied to the GPU every step (it has no GPU-resident data mode);
* plain loop, same DataLoader path (benchmarks/plain_train.py --data loader --workers N
  --pin-memory): the like-for-like reference for hpc-train's own overhead;
* plain loop, data on the GPU (--data device): one batch created on the GPU and reused, the
  usual "synthetic data" GPU benchmark with no loader and no host-to-device copy (the ceiling).
Same images/s definition on every row (global batch x steps after `--warmup` steps, over the time
from the end of step `--warmup` to the end of the last, synchronised). Peak memory: every process
started here reports torch.cuda.max_memory_allocated/reserved at exit (benchmarks/peakmem/
sitecustomize.py on PYTHONPATH), so hpc-train's worker is measured without changing it.

Estimated time on one H100 (not measured yet): 3-4 minutes for `--compile off`; `--compile on`
compiles anew in each of its 6 runs (~1.5 min each), so use `--repeats 1` under a 10-minute
limit. `--compile off` and `--compile on` can be separate commands: results merge into one
JSON per device.
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
    HERE,
    PYTHON,
    RESULTS,
    fmt_stats,
    hpc_train_cmd,
    machine_info,
    read_json,
    row,
    run_checked,
    stats,
    write_result,
)  # noqa: E402

NOT_MEASURED = "not measured (no GPU)"

# Published per-GPU training throughput for ResNet-50 (v1.5, the torchvision variant: stride 2 in
# the 3x3 convolution), for context only: different precision (fp16 AMP, not bf16), real ImageNet
# data through a data loader, NGC containers, and the publisher's tuned scripts.
PUBLISHED = [
    {
        "gpu": "A100 80GB (1 GPU of a DGX A100)",
        "images_per_sec": 2470,
        "precision": "mixed precision (fp16 AMP), NHWC",
        "batch": 256,
        "source": "NVIDIA DeepLearningExamples, PyTorch/Classification/ConvNets/resnet50v1.5/README.md, "
        "'Training performance: NVIDIA DGX A100 (8x A100 80GB)', 1-GPU row",
        "conditions": (
            "pytorch-21.03 NGC container; benchmark_training mode on ImageNet; TF32 on the same row: 938 img/s"
        ),
    },
    {
        "gpu": "V100 16GB (1 GPU of a DGX-1)",
        "images_per_sec": 1200,
        "precision": "mixed precision (fp16 AMP), NHWC",
        "batch": 256,
        "source": "same README, 'Training performance: NVIDIA DGX-1 16GB (8x V100 16GB)', 1-GPU row",
        "conditions": "pytorch-21.03 NGC container; FP32 on the same row: 367 img/s",
    },
]


def gpu_probe() -> dict:
    """Ask a child process (so this one never holds a CUDA context) what GPU there is."""
    code = (
        "import json, torch\n"
        "ok = torch.cuda.is_available()\n"
        "info = {'cuda': ok, 'torch': torch.__version__, 'cuda_version': torch.version.cuda}\n"
        "if ok:\n"
        "    p = torch.cuda.get_device_properties(0)\n"
        "    info.update(count=torch.cuda.device_count(), name=p.name, memory_gib=round(p.total_memory / 2**30, 1),\n"
        "                capability=f'{p.major}.{p.minor}', cudnn=torch.backends.cudnn.version(), "
        "bf16=torch.cuda.is_bf16_supported())\n"
        "print(json.dumps(info))\n"
    )
    try:
        proc = subprocess.run([PYTHON, "-c", code], capture_output=True, text=True, timeout=300)
        info = json.loads(proc.stdout.strip().splitlines()[-1])
    except (subprocess.SubprocessError, ValueError, IndexError):
        return {"cuda": False}
    if info.get("cuda"):
        try:
            smi = subprocess.run(
                [
                    "nvidia-smi",
                    "--query-gpu=name,driver_version,memory.total,power.limit,clocks.max.sm",
                    "--format=csv,noheader",
                    "-i",
                    "0",
                ],
                capture_output=True,
                text=True,
                timeout=30,
            ).stdout.strip()
            info["nvidia_smi"] = smi
            info["driver"] = smi.split(",")[1].strip() if "," in smi else None
        except (OSError, subprocess.SubprocessError):
            info["driver"] = None
    return info


def _peak(directory: Path) -> dict:
    """Largest peak over the processes of one run (hpc-train: its worker; plain: itself)."""
    best = {"max_allocated": 0, "max_reserved": 0}
    for path in directory.glob("peak-*.json"):
        for dev in json.loads(path.read_text())["devices"].values():
            best = {k: max(best[k], dev[k]) for k in best}
    return {k + "_gib": v / 2**30 for k, v in best.items()}


def measure(
    compile_modes,
    repeats: int,
    steps: int,
    warmup: int,
    batch: int,
    workers: int,
    model: str = "resnet50",
    image_size: int = 224,
    device: str = "cuda",
) -> dict:
    samples = batch * 8
    results = {}
    with tempfile.TemporaryDirectory(prefix="bench-gpu-") as tmp:

        def env_for(tag: str) -> dict:
            peak_dir = Path(tmp) / f"peak-{tag}"
            peak_dir.mkdir()
            pythonpath = os.pathsep.join([str(HERE / "peakmem"), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
            env = dict(os.environ, PYTHONPATH=pythonpath, HPC_BENCH_PEAKMEM_DIR=str(peak_dir))
            for key in [k for k in env if k.startswith(("SLURM_", "SUBMITIT_"))]:
                del env[key]
            return env, peak_dir

        for compiled in compile_modes:
            tag = "compile" if compiled else "eager"
            cases = {
                "hpc_train": lambda i, out, compiled=compiled: [
                    *hpc_train_cmd(
                        [
                            "strategy=single",
                            f"model={model}",
                            "data=synthetic",
                            f"data.image_size={image_size}",
                            f"data.num_samples={samples}",
                            f"data.num_workers={workers}",
                            "data.pin_memory=true",
                            f"trainer.batch_size={batch}",
                            "trainer.precision=bf16",
                            "trainer.channels_last=true",
                            f"trainer.compile={str(compiled).lower()}",
                            f"trainer.max_steps={steps}",
                            "trainer.epochs=null",
                            "trainer.eval=false",
                            f"trainer.throughput_warmup_steps={warmup}",
                            f"hydra.run.dir={out}",
                        ]
                    )
                ],
                "plain_loader": lambda i, out, compiled=compiled: [
                    PYTHON,
                    str(HERE / "plain_train.py"),
                    f"--model={model}",
                    f"--image-size={image_size}",
                    f"--num-samples={samples}",
                    f"--batch={batch}",
                    f"--steps={steps}",
                    f"--warmup={warmup}",
                    f"--device={device}",
                    "--data=loader",
                    f"--workers={workers}",
                    "--pin-memory",
                    "--precision=bf16",
                    "--channels-last",
                    *(["--compile"] if compiled else []),
                    f"--out={out}",
                ],
                "plain_device": lambda i, out, compiled=compiled: [
                    PYTHON,
                    str(HERE / "plain_train.py"),
                    f"--model={model}",
                    f"--image-size={image_size}",
                    f"--num-samples={samples}",
                    f"--batch={batch}",
                    f"--steps={steps}",
                    f"--warmup={warmup}",
                    f"--device={device}",
                    "--data=device",
                    "--precision=bf16",
                    "--channels-last",
                    *(["--compile"] if compiled else []),
                    f"--out={out}",
                ],
            }
            ips = {name: [] for name in cases}
            peaks = {name: [] for name in cases}
            for i in range(repeats):
                for name, build in cases.items():
                    env, peak_dir = env_for(f"{tag}-{name}-{i}")
                    out = Path(tmp) / (f"{tag}-{name}-{i}" + ("" if name == "hpc_train" else ".json"))
                    run_checked(build(i, out), env=env, timeout=1800)
                    summary = read_json(out / "summary.json") if name == "hpc_train" else read_json(out)
                    ips[name].append(summary["images_per_sec"])
                    peaks[name].append(_peak(peak_dir))
            results[tag] = {
                name: {
                    "images_per_sec": stats(ips[name]),
                    "peak_allocated_gib": stats([p["max_allocated_gib"] for p in peaks[name]]),
                    "peak_reserved_gib": stats([p["max_reserved_gib"] for p in peaks[name]]),
                }
                for name in cases
            }
            results[tag]["ratio_hpc_over_plain_loader"] = stats(
                [a / b for a, b in zip(ips["hpc_train"], ips["plain_loader"])]
            )
            results[tag]["ratio_hpc_over_plain_device"] = stats(
                [a / b for a, b in zip(ips["hpc_train"], ips["plain_device"])]
            )
    return results


LABELS = {
    "hpc_train": "hpc-train strategy=single",
    "plain_loader": "plain loop, same DataLoader",
    "plain_device": "plain loop, data on the GPU",
}


def table_rows(result: dict) -> list:
    if "skipped" in result:
        return [
            row(
                "gpu",
                "ResNet-50 bf16 channels_last, hpc-train single",
                None,
                "plain PyTorch loop",
                None,
                result["skipped"],
                "images/s",
            )
        ]
    out = []
    for tag in ("eager", "compile"):
        r = result["results"].get(tag)
        if not r:
            continue
        for ref in ("plain_loader", "plain_device"):
            q = r[f"ratio_hpc_over_{ref}"]
            out.append(
                row(
                    "gpu",
                    f"hpc-train single, ResNet-50 bf16 CL, {tag}",
                    r["hpc_train"]["images_per_sec"],
                    f"{LABELS[ref]}, {tag}",
                    r[ref]["images_per_sec"],
                    f"ratio {q['median']:.3f} ({q['min']:.3f}-{q['max']:.3f})",
                    "images/s",
                    note=(
                        f"peak alloc {r['hpc_train']['peak_allocated_gib']['median']:.1f} vs "
                        f"{r[ref]['peak_allocated_gib']['median']:.1f} GiB"
                    ),
                )
            )
    return out


def run(
    quick: bool = False,
    repeats: int = 0,
    compile_mode: str = "both",
    steps: int = 60,
    warmup: int = 20,
    batch: int = 256,
    workers: int = 8,
) -> dict:
    before = machine_info()
    probe = gpu_probe()
    record = {
        "benchmark": "gpu_throughput",
        "mode": "quick" if quick else "full",
        "machine": before,
        "gpu": probe,
        "published": PUBLISHED,
    }
    if not probe.get("cuda"):
        record["skipped"] = NOT_MEASURED
        record["table"] = table_rows(record)
        write_result("gpu_throughput", record)
        return record
    modes = {"off": [False], "on": [True], "both": [False, True]}[compile_mode]
    if quick:
        modes, steps, warmup = [False], min(steps, 40), min(warmup, 10)
    repeats = repeats or 2
    start = time.perf_counter()
    previous = RESULTS / "gpu_throughput.json"
    merged = {}
    if previous.exists():  # runs of --compile off and --compile on on the same device merge
        old = read_json(previous)
        if old.get("gpu", {}).get("name") == probe.get("name") and "results" in old:
            merged = old["results"]
    merged.update(measure(modes, repeats, steps, warmup, batch, workers))
    record.update(
        config={
            "model": "resnet50",
            "image_size": 224,
            "batch": batch,
            "steps": steps,
            "warmup": warmup,
            "loader_workers": workers,
            "precision": "bf16 autocast",
            "channels_last": True,
            "repeats": repeats,
        },
        results=merged,
        wall_s=time.perf_counter() - start,
    )
    record["table"] = table_rows(record)
    write_result("gpu_throughput", record)
    return record


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="eager only, fewer steps")
    parser.add_argument("--repeats", type=int, default=0, help="runs per row (default 2)")
    parser.add_argument("--compile", default="both", choices=["off", "on", "both"])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--workers", type=int, default=8, help="DataLoader workers on the loader rows")
    parser.add_argument(
        "--smoke-cpu",
        action="store_true",
        help="check the plumbing on a CPU machine (ResNet-18, 32 px, a few steps); writes nothing",
    )
    args = parser.parse_args()
    if args.smoke_cpu:
        r = measure([False], 1, 4, 2, 16, 0, model="resnet18", image_size=32, device="cpu")
        print(json.dumps(r["eager"], indent=1))
        return
    result = run(args.quick, args.repeats, args.compile, args.steps, args.warmup, args.batch, args.workers)
    if "skipped" in result:
        print(f"gpu throughput: {result['skipped']}")
        return
    g = result["gpu"]
    print(f"{g.get('name')}, driver {g.get('driver')}, torch {g.get('torch')} (CUDA {g.get('cuda_version')})")
    print(f"{'row':44s} {'images/s median (min-max)':>28s} {'peak alloc GiB':>15s}")
    for tag, r in result["results"].items():
        for name, label in LABELS.items():
            print(
                f"{label + ', ' + tag:44s} {fmt_stats(r[name]['images_per_sec'], 0):>28s} "
                f"{r[name]['peak_allocated_gib']['median']:15.1f}"
            )
    for p in PUBLISHED:
        print(
            f"published: {p['gpu']}: {p['images_per_sec']} img/s ({p['precision']}, batch {p['batch']}; {p['source']})"
        )


if __name__ == "__main__":
    main()
