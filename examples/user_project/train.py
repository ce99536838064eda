"""A plain PyTorch training script, as it runs under torchrun or on one GPU (the README's "Your own script"):
hpc-train ... -- train.py --batch_size=32 lays it out on Slurm unchanged."""

import argparse
import os

import torch
import torch.distributed as dist


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args()
    distributed = "RANK" in os.environ  # torchrun's variables (ddp, fsdp); a plain `python train.py` otherwise
    if distributed:
        dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    model = torch.nn.Linear(8, 1)
    if distributed:
        model = torch.nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(args.steps):
        x = torch.randn(args.batch_size, 8)
        loss = ((model(x) - x.sum(dim=1, keepdim=True)) ** 2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    print(f"rank {os.environ.get('RANK', 0)}: {args.steps} steps, loss {loss.item():.4f}")
    if distributed:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
