"""A training script in the shape of nanoGPT's train.py (written for these tests, not nanoGPT's code).

Module-level settings, overridden by ``configurator.py`` from ``--key=value`` arguments; the text
read from ``data/input.txt`` relative to the working directory; a checkpoint ``ckpt.pt`` in
``out_dir`` every ``eval_interval`` iterations, and ``--init_from=resume`` to continue from it
(which fails when there is none, as nanoGPT's does). It knows nothing of Slurm or hpc_train.

Its DDP switch is nanoGPT's: ``RANK`` in the environment means "under torchrun": it then starts a
process group with ``backend`` (NCCL) on ``cuda:{LOCAL_RANK}``, whatever ``--device`` says, which
fails on a machine without GPUs. ``--device=cpu`` is honoured only without ``RANK``.
"""

import os
import time

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed import init_process_group

out_dir = "out"
init_from = "scratch"  # scratch | resume
device = "cuda"
backend = "nccl"
max_iters = 40
eval_interval = 10
learning_rate = 1e-2
batch_size = 16
block_size = 8
seed = 1337
step_sleep = 0.0  # seconds after each iteration (the tests slow a run down to interrupt it)
exec(open("configurator.py").read())  # overrides from the command line, nanoGPT-style
print(f"config: learning_rate={learning_rate!r} max_iters={max_iters!r} init_from={init_from!r}", flush=True)

ddp = int(os.environ.get("RANK", -1)) != -1  # is this a ddp run?
if ddp:
    init_process_group(backend=backend)
    device = f"cuda:{int(os.environ['LOCAL_RANK'])}"
    torch.cuda.set_device(device)

torch.manual_seed(seed)
text = open(os.path.join("data", "input.txt")).read()
chars = sorted(set(text))
data = torch.tensor([chars.index(c) for c in text], dtype=torch.long)
vocab = len(chars)


class Bigram(nn.Module):
    def __init__(self, vocab: int) -> None:
        super().__init__()
        self.table = nn.Embedding(vocab, vocab)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.table(idx)


def get_batch(iteration: int):
    generator = torch.Generator().manual_seed(seed + iteration)
    ix = torch.randint(len(data) - block_size - 1, (batch_size,), generator=generator)
    x = torch.stack([data[i : i + block_size] for i in ix])
    y = torch.stack([data[i + 1 : i + 1 + block_size] for i in ix])
    return x.to(device), y.to(device)


model = Bigram(vocab).to(device)
optimizer = torch.optim.AdamW(model.parameters(), lr=learning_rate)
iter_num = 0
if init_from == "resume":
    checkpoint = torch.load(os.path.join(out_dir, "ckpt.pt"), map_location=device)
    model.load_state_dict(checkpoint["model"])
    optimizer.load_state_dict(checkpoint["optimizer"])
    iter_num = checkpoint["iter_num"]
    print(f"resuming from iter {iter_num}", flush=True)

while iter_num < max_iters:
    x, y = get_batch(iter_num)
    loss = F.cross_entropy(model(x).view(-1, vocab), y.view(-1))
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    iter_num += 1
    print(f"iter {iter_num}: loss {loss.item():.4f}", flush=True)
    if iter_num % eval_interval == 0 or iter_num == max_iters:
        os.makedirs(out_dir, exist_ok=True)
        state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "iter_num": iter_num}
        torch.save(state, os.path.join(out_dir, "ckpt.pt.tmp"))
        os.replace(os.path.join(out_dir, "ckpt.pt.tmp"), os.path.join(out_dir, "ckpt.pt"))
    time.sleep(step_sleep)

with torch.no_grad():
    x, y = get_batch(10**6)
    print(f"val loss {F.cross_entropy(model(x).view(-1, vocab), y.view(-1)).item():.4f}", flush=True)
