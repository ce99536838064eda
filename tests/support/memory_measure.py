"""The measured side of the memory estimate's test: a job's training step run for real, on real tensors, in one
process per rank over gloo, its peak of live tensors taken by torch's MemTracker.

Each rank builds what its trainer builds, from the same job spec and with the project's own parts (the strategy, the
user's model, activation checkpointing, the optimizer), then runs two optimizer steps as the trainer's ``train_step``
does (gradients zeroed, the strategy's accumulation, the gradient norm, the optimizer's step). Nothing of the
estimate's simulation is used: only its reading of the spec and the tracker that takes micro-batches.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict, List

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from omegaconf import OmegaConf

from hpc_train.compute.data.loaders import set_data_shard
from hpc_train.compute.fit.estimate import EstimateSettings
from hpc_train.compute.fit.fake_world import rank_info
from hpc_train.compute.fit.trackers import peak_snapshot, tracker_for
from hpc_train.compute.parallel import build_strategy, rank_data_shard
from hpc_train.compute.parallel.base import StrategySetup
from hpc_train.compute.training.activation_checkpointing import checkpoint_blocks
from hpc_train.compute.training.optim import make_optimizer, param_groups
from hpc_train.compute.user.building import build_datasets, build_loss, build_model, collate
from hpc_train.compute.user.step import build_step

STEPS = 2


def measured_peak(spec: Dict[str, Any], rank: int) -> int:
    """Bytes of live tensors at this rank's peak over two real training steps of `spec`'s job."""
    settings = EstimateSettings.from_job_spec(OmegaConf.create(spec), "cpu")
    ranks = rank_info(settings.layout, rank)
    shard = rank_data_shard(settings.layout, ranks)
    set_data_shard(*shard)
    batch = collate(build_datasets(settings.data), int(settings.trainer.batch_size) // shard[1])
    loss_fn = build_loss(settings.trainer.loss)
    setup = StrategySetup(
        settings.strategy,
        ranks,
        [torch.device("cpu")],
        str(settings.trainer.precision),
        False,
        loss_fn,
        build_step(settings.trainer.step, loss_fn),
        [],
        settings.layout,
    )
    strategy = build_strategy(setup, shard)
    model = build_model(settings.model)
    if str(settings.trainer.activation_checkpointing) == "blocks":
        checkpoint_blocks(model)
    model = strategy.wrap(model, batch[0] if strategy.needs_example else None)
    optimizer = make_optimizer(settings.optim, param_groups(settings.optim, strategy.unwrap(model)))
    tracker = tracker_for(model, optimizer, batch, once=False)  # MemTracker: every live tensor, by storage
    with tracker:
        for _ in range(STEPS):
            optimizer.zero_grad(set_to_none=True)
            strategy.accumulate(model, batch, None, int(settings.optim.grad_accum_steps))
            strategy.grad_norm(model, None)
            optimizer.step()
            tracker.reset_mod_stats()
    return int(peak_snapshot(tracker)["Total"])


def rank_main(rank: int, world: int, store: str, specs: List[Dict[str, Any]], out: str) -> None:
    """One gloo rank (torch.multiprocessing's entry): each spec's peak, written to `out`/rank<r>.json."""
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    try:
        peaks = [measured_peak(spec, rank) for spec in specs]
    finally:
        dist.destroy_process_group()
    Path(out, f"rank{rank}.json").write_text(json.dumps(peaks))


def measure_layouts(specs: List[Dict[str, Any]], world: int, folder: Path) -> List[List[int]]:
    """Each spec's peak per rank (``result[spec][rank]``), measured in one real `world`-rank gloo run that takes the
    specs in turn (rank_main's files under `folder`)."""
    args = (world, str(folder / "store"), specs, str(folder))
    mp.start_processes(rank_main, args=args, nprocs=world, start_method="spawn")
    per_rank = [json.loads((folder / f"rank{rank}.json").read_text()) for rank in range(world)]
    return [[per_rank[rank][index] for rank in range(world)] for index in range(len(specs))]
