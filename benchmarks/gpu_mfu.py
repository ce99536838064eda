"""MFU on one GPU, as hpc-train reports it, next to the same figure computed by hand from the step time.

Two runs, each a fresh `hpc-train strategy=single` process on GPU 0:
* ResNet-50, 224x224 synthetic images, bf16 autocast, channels_last, batch 128;
* the Llama example (examples/llama_project, `trainer=llama_tokens`: its own step returns the tokens), bf16.
hpc-train's figure is summary.json's `mfu` (its FLOPs counted on a real step by torch's formulas, over the timed
steps' mean duration, against the table's dense peak for the device's name). The hand figure uses the textbook count
instead: ResNet-50's forward is 4.09 G multiply-adds per 224x224 image (8.18 GFLOPs), and a training step is about 3x
the forward (backward: gradients of weights and of activations); the Llama model's is 6 x parameters x tokens plus
12 x layers x dim x seq_len per token for attention's two matrix products (forward and backward). Both divide by the
same measured step time (`step_time_s`) and the same peak, so they differ only in how the FLOPs are counted.
Without a CUDA GPU it writes "not measured (no GPU)".
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import REPO, hpc_train_cmd, machine_info, read_json, run_checked, write_result  # noqa: E402

RESNET50_FORWARD_FLOPS = 2 * 4.09e9  # per 224x224 image (torchvision's ResNet-50: 4.09 G multiply-adds)
STEPS, WARMUP = 30, 10


def resnet50(run_dir: Path) -> dict:
    batch = 128
    run_checked(
        hpc_train_cmd(
            [
                "strategy=single",
                "model=resnet50",
                "data=synthetic",
                "data.image_size=224",
                f"data.num_samples={batch * STEPS}",
                "data.num_workers=4",
                "data.pin_memory=true",
                f"trainer.batch_size={batch}",
                f"trainer.max_steps={STEPS}",
                f"trainer.throughput_warmup_steps={WARMUP}",
                "trainer.precision=bf16",
                "trainer.channels_last=true",
                "trainer.eval=false",
                "trainer.checkpoint_every=0",
                f"hydra.run.dir={run_dir}",
            ]
        ),
        env=None,
    )
    summary = read_json(run_dir / "summary.json")
    hand = 3 * RESNET50_FORWARD_FLOPS * batch / summary["step_time_s"] / 1e12
    return _row("ResNet-50, bf16, batch 128, 224 px", summary, hand)


def llama(run_dir: Path) -> dict:
    project = REPO / "examples" / "llama_project"
    run_checked(
        hpc_train_cmd(
            [
                "--config-dir",
                "conf",
                "model=llama_tiny",
                "data=herd_log",
                "trainer=llama_tokens",
                "strategy=single",
                f"trainer.max_steps={STEPS}",
                f"trainer.throughput_warmup_steps={WARMUP}",
                "trainer.precision=bf16",
                "trainer.eval=false",
                "trainer.checkpoint_every=0",
                f"hydra.run.dir={run_dir}",
            ]
        ),
        cwd=project,
    )
    summary = read_json(run_dir / "summary.json")
    spec = yaml.safe_load((run_dir / "job_config.yaml").read_text())
    model, data = spec["model"], spec["data"]
    dim, layers, vocab, seq = model["dim"], model["n_layers"], model["vocab_size"], data["seq_len"]
    # the matrix products' parameters: attention (4 d^2), SwiGLU (3 d h), the output layer (d V) per token
    params = layers * (4 * dim * dim + 3 * dim * model["hidden_dim"]) + dim * vocab
    tokens = spec["trainer"]["batch_size"] * seq
    flops = 6 * params * tokens + 12 * layers * dim * seq * tokens
    hand = flops / summary["step_time_s"] / 1e12
    return _row(f"Llama example (dim {dim}, {layers} layers), bf16", summary, hand)


def _row(name: str, summary: dict, hand_tflops: float) -> dict:
    peak = summary.get("peak_tflops")
    return {
        "run": name,
        "device": summary.get("device_name"),
        "peak_tflops": peak,
        "hpc_train_tflops": summary.get("tflops_per_device"),
        "hpc_train_mfu": summary.get("mfu"),
        "hand_tflops": hand_tflops,
        "hand_mfu": hand_tflops / peak if peak else None,
        "step_time_s": summary.get("step_time_s"),
        "flops_per_step": summary.get("flops_per_step"),
    }


def main() -> None:
    try:
        import torch  # only to ask whether there is a GPU

        has_gpu = torch.cuda.is_available()
    except ImportError:
        has_gpu = False
    result = {"benchmark": "gpu_mfu", "machine": machine_info()}
    if not has_gpu:
        result["skipped"] = "not measured (no GPU)"
        write_result("gpu_mfu", result)
        print(result["skipped"])
        return
    with tempfile.TemporaryDirectory(prefix="bench-mfu-") as tmp:
        result["rows"] = [resnet50(Path(tmp) / "resnet50"), llama(Path(tmp) / "llama")]
    write_result("gpu_mfu", result)
    for row in result["rows"]:
        print(
            f"{row['run']} on {row['device']}: hpc-train {row['hpc_train_tflops']:.1f} TFLOP/s (MFU"
            f" {100 * (row['hpc_train_mfu'] or 0):.1f} %), by hand {row['hand_tflops']:.1f} TFLOP/s (MFU"
            f" {100 * (row['hand_mfu'] or 0):.1f} %)"
        )


if __name__ == "__main__":
    main()
