"""The reference every throughput benchmark compares hpc-train against: a plain, hand-written
PyTorch training loop, i.e. what a user writes without any toolkit.

* model: a torchvision ResNet, random init (as hpc-train's `model=resnetXX`);
* data (`--data loader`, default): the same synthetic tensors hpc-train's `data=synthetic` builds
  (`torch.randn` / `torch.randint` from a generator seeded with 1) in a `TensorDataset`, read through
  a `DataLoader(shuffle=True, drop_last=True)`; under torchrun a `DistributedSampler` instead of
  shuffle. `--data device`: one batch created once on the device and reused every step (the usual
  "synthetic data on the GPU" benchmark: no loader, no host-to-device copy);
* SGD (momentum 0.9, weight decay 5e-4), cross-entropy, cosine LR schedule, optional bf16 autocast,
  channels_last and torch.compile; the loss is read (`.item()`) every `--log-every` steps;
* under torchrun (WORLD_SIZE > 1): `init_process_group` (gloo on CPU, nccl on GPU) and
  `DistributedDataParallel`, each rank reading `--batch / WORLD_SIZE` samples per step.

Throughput uses hpc-train's definition: `--batch` (the global batch) x steps after the first
`--warmup` steps, divided by the time from the end of step `--warmup` to the end of the last
step (synchronised on GPUs). Rank 0 writes {"images_per_sec", ...} to `--out`.

    python benchmarks/plain_train.py --steps 20 --warmup 3 --out /tmp/plain.json
    torchrun --standalone --nproc-per-node 2 benchmarks/plain_train.py --batch 64 --out /tmp/ddp.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import time

import torch
import torch.nn as nn
import torchvision


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="resnet18")
    p.add_argument("--image-size", type=int, default=64)
    p.add_argument("--num-classes", type=int, default=10)
    p.add_argument("--num-samples", type=int, default=1024)
    p.add_argument("--batch", type=int, default=64, help="global batch per optimizer step (split over DDP ranks)")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3, help="steps excluded from the images/s measurement")
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: OMP_NUM_THREADS if set)")
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    p.add_argument("--data", default="loader", choices=["loader", "device"])
    p.add_argument("--workers", type=int, default=0)
    p.add_argument("--pin-memory", action="store_true")
    p.add_argument("--precision", default="32", choices=["32", "bf16"])
    p.add_argument("--channels-last", action="store_true")
    p.add_argument("--compile", action="store_true")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--log-every", type=int, default=10)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None, help="JSON result file (rank 0)")
    return p.parse_args(argv)


def main(argv=None) -> dict:
    args = parse_args(argv)
    threads = args.threads or (int(os.environ["OMP_NUM_THREADS"]) if os.environ.get("OMP_NUM_THREADS") else None)
    if threads:
        torch.set_num_threads(threads)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    use_cuda = args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())
    device = torch.device("cuda", local_rank) if use_cuda else torch.device("cpu")
    if use_cuda:
        torch.cuda.set_device(device)
    if world > 1:
        torch.distributed.init_process_group("nccl" if use_cuda else "gloo")
    per_rank = args.batch // world

    torch.manual_seed(args.seed)
    model = getattr(torchvision.models, args.model)(weights=None, num_classes=args.num_classes).to(device)
    if args.channels_last:
        model = model.to(memory_format=torch.channels_last)
    if world > 1:
        model = nn.parallel.DistributedDataParallel(model, device_ids=[device] if use_cuda else None)
    if args.compile:
        model = torch.compile(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9, weight_decay=5e-4)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=args.steps)
    loss_fn = nn.CrossEntropyLoss()
    amp = torch.autocast(device.type, dtype=torch.bfloat16) if args.precision == "bf16" else contextlib.nullcontext()
    memory_format = torch.channels_last if args.channels_last else torch.contiguous_format

    sampler = None
    if args.data == "loader":
        gen = torch.Generator().manual_seed(1)
        images = torch.randn(args.num_samples, 3, args.image_size, args.image_size, generator=gen)
        labels = torch.randint(0, args.num_classes, (args.num_samples,), generator=gen)
        dataset = torch.utils.data.TensorDataset(images, labels)
        if world > 1:
            sampler = torch.utils.data.DistributedSampler(dataset, shuffle=True, seed=args.seed, drop_last=True)
        loader = torch.utils.data.DataLoader(
            dataset,
            batch_size=per_rank,
            shuffle=sampler is None,
            sampler=sampler,
            drop_last=True,
            num_workers=args.workers,
            pin_memory=args.pin_memory and use_cuda,
            persistent_workers=args.workers > 0,
        )
    else:
        batch = (
            torch.randn(per_rank, 3, args.image_size, args.image_size, device=device).contiguous(
                memory_format=memory_format
            ),
            torch.randint(0, args.num_classes, (per_rank,), device=device),
        )
        loader = [batch] * max(1, args.num_samples // args.batch)

    def sync():
        if use_cuda:
            torch.cuda.synchronize(device)

    warmup = min(args.warmup, args.steps - 1)
    step, epoch, start, last_loss = 0, 0, None, None
    model.train()
    while step < args.steps:
        if sampler is not None:
            sampler.set_epoch(epoch)
        for images, labels in loader:
            images = images.to(device, non_blocking=True).contiguous(memory_format=memory_format)
            labels = labels.to(device, non_blocking=True)
            optimizer.zero_grad(set_to_none=True)
            with amp:
                loss = loss_fn(model(images), labels)
            loss.backward()
            optimizer.step()
            scheduler.step()
            step += 1
            if step % args.log_every == 0 or step == args.steps:
                last_loss = loss.item()
            if step == warmup:
                sync()
                start = time.perf_counter()
            if step >= args.steps:
                break
        epoch += 1
    sync()
    seconds = time.perf_counter() - start
    result = {
        "images_per_sec": (args.steps - warmup) * args.batch / seconds,
        "timed_steps": args.steps - warmup,
        "global_batch": args.batch,
        "world_size": world,
        "train_loss": last_loss,
        "device": str(device),
        "threads": torch.get_num_threads(),
        "torch_version": torch.__version__,
        "args": vars(args),
    }
    if use_cuda:
        result["max_memory_allocated_bytes"] = torch.cuda.max_memory_allocated(device)
        result["max_memory_reserved_bytes"] = torch.cuda.max_memory_reserved(device)
    if world > 1:
        torch.distributed.destroy_process_group()
    if rank == 0 and args.out:
        with open(args.out, "w") as handle:
            json.dump(result, handle, indent=2)
    return result


if __name__ == "__main__":
    main()
