"""trainer.activation_checkpointing=blocks: keep only each block's input, recompute its activations in backward.

The blocks are those FSDP shards one by one (the model's repeated block list, else its direct
children holding parameters). Each block's ``forward`` is replaced, on the instance, by
``torch.utils.checkpoint.checkpoint`` of the original (non-reentrant, RNG state preserved, so
dropout draws the same numbers when recomputed): the module tree and the parameter names
stay as they were, so checkpoints and model.pt are unchanged, and wrappers put around the block
later (DDP, FSDP's hooks) see a module like any other. Batch norm inside a block updates its
running statistics again when recomputed.
"""

from __future__ import annotations

import functools

import torch.nn as nn
from torch.utils.checkpoint import checkpoint

from hpc_train.compute.parallel.sharding import shard_units


def _checkpointed(forward, *args, **kwargs):
    return checkpoint(forward, *args, use_reentrant=False, **kwargs)


def checkpoint_blocks(model: nn.Module) -> str:
    """Wrap every block's forward in activation checkpointing; what was wrapped, for the log."""
    blocks = shard_units(model)
    for block in blocks:
        block.forward = functools.partial(_checkpointed, block.forward)
    kinds = sorted({type(b).__name__ for b in blocks})
    return f"{len(blocks)} blocks ({', '.join(kinds)}) recompute their activations in the backward pass"
