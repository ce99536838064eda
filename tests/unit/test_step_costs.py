"""One training step's costs counted on the memory estimate's fake tensors (hpc_train.compute.fit.costs): the FLOP
counter's count, and the bytes the step's collectives send per rank, by kind and link (toy_mlp, in one process)."""

from __future__ import annotations

from pathlib import Path
from typing import List

from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from hpc_train.compute.fit.estimate import EstimateSettings, estimate_job
from hpc_train.conf import CONFIG_DIR
from hpc_train.launch.planning.jobspec import build_job_spec
from hpc_train.launch.planning.plan import make_plan

BATCH, PIXELS, HIDDEN, CLASSES = 8, 3 * 8 * 8, 64, 10  # toy_mlp on 8 px images: 192 -> 64 -> 10
PARAMETER_BYTES = (PIXELS * HIDDEN + HIDDEN + HIDDEN * CLASSES + CLASSES) * 4


def estimate(overrides: List[str], run_dir: Path):
    base = ["model=toy_mlp", "data=synthetic", "data.image_size=8", f"trainer.batch_size={BATCH}"]
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        cfg = compose(config_name="config", overrides=[*base, *overrides])
    spec = build_job_spec(make_plan(cfg, run_dir), choices={})
    return estimate_job(EstimateSettings.from_job_spec(OmegaConf.create(spec)), costs=True)


def test_one_rank_counts_its_products_forward_and_backward_and_sends_nothing(tmp_path):
    (rank,) = estimate(["strategy=single"], tmp_path).ranks
    # forward 2 B M N per product; backward 2 B M N for the weights' gradients, and for the input's gradient of
    # the second product only (the first layer's input is the batch)
    assert rank.flops == 2 * BATCH * (3 * HIDDEN * CLASSES + 2 * PIXELS * HIDDEN)
    assert rank.comm == {} and rank.messages == {}


def test_fsdp_over_two_ranks_halves_the_products_and_reduce_scatters_every_gradient_once(tmp_path):
    rank = estimate(["strategy=fsdp", "resources.gpus_per_node=2"], tmp_path).ranks[0]
    assert rank.flops == 2 * (BATCH // 2) * (3 * HIDDEN * CLASSES + 2 * PIXELS * HIDDEN)
    # ring reduce-scatter: (n - 1) / n of the whole gradients, on one node
    assert rank.comm["reduce_scatter"] == {"intra": PARAMETER_BYTES // 2}
    assert rank.comm["all_gather"]["intra"] >= PARAMETER_BYTES // 2
    assert rank.messages["intra"] >= 2  # each collective issued, for the link's latency
    assert set(rank.as_dict()) >= {"flops", "comm", "peak"}
