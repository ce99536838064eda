"""The memory estimate (hpc_train.compute.fit) against measurement, per rank, on a larger model than the test's.

CPU part (always): the Llama-style model of examples/llama_project (`--dim` 512, `--layers` 8, SwiGLU 1536, 8 heads,
`--seq` 128 tokens, a global batch of `--batch` 16, vocabulary 48, AdamW) in six layouts on 4 ranks: one process,
ddp 4, fsdp 4 (fp32 and bf16), tp 2 x fsdp 2 (the example's plan) and pp 2 x fsdp 2. Each layout's job spec is the one
hpc-train writes for its overrides. Estimated: every rank (`estimate_job(settings, ranks=range(4))`), on fake tensors
in the fake process group, timed. Measured: the same job's training step run for real, 2 optimizer steps, one gloo
process per rank (1 intra-op thread), all layouts in one 4-rank run, each rank's peak of live tensors taken by torch's
MemTracker (tests/support/memory_measure.py, the e2e test's measured side); the one-process layout in this process.
Figure: (estimate - measured) / measured per rank.

GPU part (only with CUDA, else recorded as skipped): the one-process layout of the CPU model and of a larger one
(`--gpu-dim` 2048, 8 blocks, 1024 tokens, batch 4), fp32 and bf16, trained 2 steps on the GPU with the project's
parts; torch.cuda.max_memory_allocated (the tensors) against the estimate, and torch.cuda.max_memory_reserved (what
the caching allocator held) against the estimate plus the family's allocator slack
(hpc_train.contracts.gpu_memory: the card's family by its name; the CUDA context is outside both torch figures).

Writes results/memory_estimate.json.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import REPO, machine_info, write_result  # noqa: E402

sys.path.insert(0, str(REPO))
PROJECT = REPO / "examples" / "llama_project"
WORLD = 4
FOUR = ["resources.gpus_per_node=4"]
LAYOUTS = {
    "single": ["strategy=single"],
    "ddp4": ["strategy=ddp", *FOUR],
    "fsdp4": ["strategy=fsdp", *FOUR],
    "fsdp4_bf16": ["strategy=fsdp", *FOUR, "trainer.precision=bf16"],
    "tp2_fsdp2": ["strategy=llama_tp", *FOUR],
    "pp2_fsdp2": ["strategy=mesh", "strategy.pp=2", *FOUR],
}
GPU_CASES = {"fp32": ["trainer.precision=32"], "bf16": ["trainer.precision=bf16"]}


def model_overrides(dim: int, layers: int, seq: int, batch: int) -> List[str]:
    hidden = 256 * ((int(8 * dim / 3) + 255) // 256)  # SwiGLU's 8/3 d, rounded up to a multiple of 256
    return [
        f"hydra.searchpath=[file://{PROJECT / 'conf'}]",
        "model=llama_tiny",
        f"model.dim={dim}",
        f"model.n_layers={layers}",
        f"model.hidden_dim={hidden}",
        "model.n_heads=8",
        "data=herd_log",
        f"data.seq_len={seq}",
        "trainer=llama",
        f"trainer.batch_size={batch}",
    ]


def job_spec(overrides: List[str], run_dir: Path) -> Dict[str, Any]:
    """The job spec `hpc-train OVERRIDES` writes (composed, checked, laid out)."""
    from hydra import compose, initialize_config_dir

    from hpc_train.conf import CONFIG_DIR
    from hpc_train.launch.planning.jobspec import build_job_spec
    from hpc_train.launch.planning.plan import make_plan

    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        cfg = compose(config_name="config", overrides=overrides)
    return build_job_spec(make_plan(cfg, run_dir), choices={})


def estimated(spec: Dict[str, Any], ranks: List[int], device: str = "cpu") -> Dict[str, Any]:
    """The estimate of `spec`'s `ranks` for ranks on `device` (cpu: as the CPU runs measured here; gpu: as torch
    picks the optimizer's kernels on a GPU)."""
    from omegaconf import OmegaConf

    from hpc_train.compute.fit.estimate import EstimateSettings, estimate_job

    started = time.perf_counter()
    estimate = estimate_job(EstimateSettings.from_job_spec(OmegaConf.create(spec), device), ranks=ranks)
    seconds = time.perf_counter() - started
    return {"peaks": [r.peak for r in estimate.ranks], "seconds": seconds, "parts_rank0": estimate.ranks[0].as_dict()}


def measured_cpu(specs: Dict[str, Dict[str, Any]], tmp: Path) -> Dict[str, List[int]]:
    """Each layout's peak per rank on real tensors: the one-process layout here, the others in one 4-rank gloo run."""
    from tests.support import memory_measure

    names = [name for name in specs if name != "single"]
    measured = dict(zip(names, memory_measure.measure_layouts([specs[name] for name in names], WORLD, tmp)))
    return {"single": [memory_measure.measured_peak(specs["single"], 0)], **measured}


def cpu_part(args: argparse.Namespace, tmp: Path) -> Dict[str, Any]:
    base = model_overrides(args.dim, args.layers, args.seq, args.batch)
    specs = {name: job_spec([*base, *extra], tmp / name) for name, extra in LAYOUTS.items()}
    started = time.perf_counter()
    measured = measured_cpu(specs, tmp)
    measure_s = time.perf_counter() - started
    layouts = {}
    for name, spec in specs.items():
        estimate = estimated(spec, list(range(len(measured[name]))))
        errors = [(e - m) / m for e, m in zip(estimate["peaks"], measured[name])]
        layouts[name] = {**estimate, "measured": measured[name], "errors": errors}
        worst = max(errors, key=abs)
        line = f"{name:11s} estimate {estimate['peaks'][0] / 2**20:8.2f} MiB, measured {measured[name][0] / 2**20:8.2f}"
        print(f"{line} MiB (rank 0), worst rank {worst:+.2%}, {estimate['seconds']:.1f} s to estimate", flush=True)
    return {"model": base, "layouts": layouts, "measure_s": measure_s}


def gpu_step(spec: Dict[str, Any]) -> Dict[str, int]:
    """Two training steps of the one-process job on the GPU, as the trainer runs them: torch's peaks."""
    import torch
    from omegaconf import OmegaConf

    from hpc_train.compute.fit.estimate import EstimateSettings
    from hpc_train.compute.fit.fake_world import rank_info
    from hpc_train.compute.parallel import build_strategy
    from hpc_train.compute.parallel.base import StrategySetup
    from hpc_train.compute.training.optim import make_optimizer, param_groups
    from hpc_train.compute.user.building import build_datasets, build_loss, build_model, collate
    from hpc_train.compute.user.step import build_step

    settings = EstimateSettings.from_job_spec(OmegaConf.create(spec), "cpu")
    device = torch.device("cuda")
    loss_fn = build_loss(settings.trainer.loss)
    step_fn = build_step(settings.trainer.step, loss_fn)
    precision = str(settings.trainer.precision)
    ranks = rank_info(settings.layout, 0)
    setup = StrategySetup(settings.strategy, ranks, [device], precision, False, loss_fn, step_fn, [], settings.layout)
    strategy = build_strategy(setup, (0, 1))
    batch = [t.to(device) for t in collate(build_datasets(settings.data), int(settings.trainer.batch_size))]
    model = strategy.wrap(build_model(settings.model))
    optimizer = make_optimizer(settings.optim, param_groups(settings.optim, strategy.unwrap(model)))
    torch.cuda.reset_peak_memory_stats()
    for _ in range(2):
        optimizer.zero_grad(set_to_none=True)
        strategy.accumulate(model, batch, None, int(settings.optim.grad_accum_steps))
        strategy.grad_norm(model, None)
        optimizer.step()
    torch.cuda.synchronize()
    return {"allocated": torch.cuda.max_memory_allocated(), "reserved": torch.cuda.max_memory_reserved()}


def gpu_part(args: argparse.Namespace, tmp: Path) -> Dict[str, Any]:
    import torch

    from hpc_train.contracts.gpu_memory import FAMILIES, TYPES, GpuMemory, device_bytes

    name = torch.cuda.get_device_name(0)
    row = next((t for key, t in sorted(TYPES.items(), key=lambda kv: -len(kv[0])) if key in name.lower()), None)
    family = FAMILIES[row.family if row is not None else "hopper"]
    memory = GpuMemory(torch.cuda.get_device_properties(0).total_memory, family, name)
    models = {"cpu_model": (args.dim, args.layers, args.seq, args.batch), "larger": (args.gpu_dim, 8, 1024, 4)}
    cases = {}
    for model, shape in models.items():
        for precision, extra in GPU_CASES.items():
            spec = job_spec([*model_overrides(*shape), "strategy=single", *extra], tmp / f"gpu_{model}_{precision}")
            estimate = estimated(spec, [0], "gpu")["peaks"][0]
            real = gpu_step(spec)
            slack = device_bytes(memory, estimate, 0) - int(family.context_gib * 2**30)
            cases[f"{model}_{precision}"] = {
                "estimate": estimate,
                **real,
                "allocated_error": (estimate - real["allocated"]) / real["allocated"],
                "estimate_with_slack": estimate + slack,
                "reserved_error": (estimate + slack - real["reserved"]) / real["reserved"],
            }
            print(f"gpu {model} {precision}: {json.dumps(cases[f'{model}_{precision}'])}", flush=True)
    return {"device": name, "family": row.family if row is not None else "hopper (unknown card)", "cases": cases}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dim", type=int, default=512)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--gpu-dim", type=int, default=2048)
    parser.add_argument("--no-cpu", action="store_true", help="the GPU part alone")
    args = parser.parse_args()
    import torch

    sys.path.insert(0, str(PROJECT))  # the example's package, as hpc-train run from its folder imports it
    result: Dict[str, Any] = {"benchmark": "memory_estimate", "machine": machine_info(busy_seconds=1.0)}
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="bench-memest-") as tmp:
        if not args.no_cpu:
            result["cpu"] = cpu_part(args, Path(tmp))
        if torch.cuda.is_available():
            result["gpu"] = gpu_part(args, Path(tmp))
        else:
            result["gpu"] = {"skipped": "not measured (no GPU)"}
            print("GPU part: not measured (no GPU)")
    result["wall_s"] = time.perf_counter() - started
    write_result("memory_estimate", result)
    print(f"{result['wall_s']:.0f} s; results in benchmarks/results/memory_estimate.json")


if __name__ == "__main__":
    main()
