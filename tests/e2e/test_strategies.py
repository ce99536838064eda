"""Every strategy computes what single-device training computes (real processes, gloo on CPU); DDP is exact (its
ranks end with identical parameters, rank 0 alone writes the outputs)."""

import json
import re
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from hpc_train.compute.parallel.partitioning import agree_on_counts
from tests.support.cli import TINY, assert_ok, read_summary, run_cli

pytestmark = pytest.mark.usefixtures("warm_ranks")  # ranks forked warm (tests/support/warm_ranks.py)

COMMON = [*TINY, "trainer.batch_size=32", "trainer.max_steps=20", "trainer.epochs=null", "trainer.eval=false", "seed=7"]

# The in-process pipeline's cuts (explicit and time balance, one chunk) are checked output for output and gradient for
# gradient against the unsplit model in tests/unit (test_model_split_in_process.py, test_pipeline_balance.py); here
# three stages run in pipeline-4, and the pipelining engine's time balance runs with its 1f1b schedule.
VARIANTS = {
    "single": ["strategy=single"],
    "dp": ["strategy=dp"],
    "model_parallel-2": ["strategy=model_parallel", "strategy.stages=2"],
    "pipeline-2": ["strategy=pipeline", "strategy.stages=2", "strategy.chunks=2"],
    "pipeline-4": ["strategy=pipeline", "strategy.stages=3", "strategy.chunks=4"],
    "ddp-2": ["strategy=ddp", "resources.gpus_per_node=2"],
    "hybrid-2x2": ["strategy=hybrid", "strategy.stages=2", "resources.gpus_per_node=4"],
    "pipelining-gpipe": [
        "strategy=pipeline",
        "strategy.engine=pipelining",
        "resources.gpus_per_node=2",
        "strategy.chunks=4",
    ],
    "pipelining-1f1b-time-balanced": [
        "strategy=pipeline",
        "strategy.engine=pipelining",
        "resources.gpus_per_node=2",
        "strategy.chunks=4",
        "strategy.schedule=1f1b",
        "strategy.balance=time",
    ],
    "pipelining-2x2": [
        "strategy=pipeline",
        "strategy.engine=pipelining",
        "resources.gpus_per_node=4",
        "strategy.stages=2",
        "strategy.chunks=2",
    ],
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Each variant's run dir. Two runs at a time: a run is mostly process start-up, and the other test worker's
    Slurm tests mostly wait on the cluster."""
    base = tmp_path_factory.mktemp("strategies")

    def run(name: str):
        proc = run_cli([*COMMON, *VARIANTS[name]], base / name)
        assert_ok(proc)
        assert read_summary(base / name)["global_step"] == 20
        return base / name

    with ThreadPoolExecutor(max_workers=2) as pool:
        return dict(zip(VARIANTS, pool.map(run, VARIANTS)))


@pytest.fixture(scope="module")
def losses(runs):
    """Each variant's summary."""
    return {name: read_summary(run_dir) for name, run_dir in runs.items()}


# -- ddp, in detail (its run is the ddp-2 variant's) ---------------------------------------------------------------
def _digests(run_dir, world):
    found = []
    for rank in range(world):
        text = (run_dir / "logs" / f"rank{rank}.log").read_text()
        found.append(re.findall(r"final parameter digest ([0-9a-f]{64})", text)[-1])
    return found


def _logged_losses(run_dir):
    """The train loss of each logged step (trainer.log_every: steps 10 and 20 here), from the run's metrics."""
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {record["step"]: record["loss"] for record in records if record["kind"] == "train"}


def test_ddp_matches_single_process_loss(losses, runs):
    single, ddp = losses["single"], losses["ddp-2"]
    assert single["world_size"] == 1 and ddp["world_size"] == 2
    assert single["global_step"] == ddp["global_step"] == 20
    # Same seed, same global batch, same samples per step: the losses agree to rounding error, step for step.
    curve, ddp_curve = _logged_losses(runs["single"]), _logged_losses(runs["ddp-2"])
    assert list(curve) == list(ddp_curve) == [10, 20]
    assert list(ddp_curve.values()) == pytest.approx(list(curve.values()), rel=1e-4)
    assert ddp["train_loss"] == pytest.approx(single["train_loss"], rel=1e-4)
    # And training did something: the loss fell between the logged steps (2.28 to 1.89), far beyond rounding.
    assert curve[20] < curve[10] - 0.1


def test_ddp_ranks_end_with_identical_parameters(runs):
    rank0, rank1 = _digests(runs["ddp-2"], 2)
    assert rank0 == rank1


def test_only_rank_zero_writes_outputs(runs):
    run_dir = runs["ddp-2"]
    assert (run_dir / "summary.json").exists() and (run_dir / "model.pt").exists()
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    for kind in ("train", "checkpoint"):
        steps = [int(re.search(r'"step": (\d+)', line).group(1)) for line in lines if f'"kind": "{kind}"' in line]
        assert steps == sorted(set(steps)), f"one {kind} line per step: a second writer would duplicate them"
    assert any('"kind": "checkpoint"' in line for line in lines)  # the end of training's checkpoint, by rank 0
    assert (run_dir / "logs" / "rank0.log").exists() and (run_dir / "logs" / "rank1.log").exists()


def test_summary_fields(losses):
    summary = losses["ddp-2"]
    for key in (
        "strategy",
        "world_size",
        "global_step",
        "train_loss",
        "eval_accuracy",
        "samples_per_sec",
        "images_per_sec",
        "resumed_from_step",
    ):
        assert key in summary
    assert summary["strategy"] == "ddp"
    assert summary["eval_accuracy"] is None  # eval was off
    assert summary["resumed_from_step"] is None
    assert (
        summary["samples_per_sec"] > 0 and summary["images_per_sec"] == summary["samples_per_sec"]
    )  # the old name, kept


@pytest.mark.parametrize("name", [n for n in VARIANTS if n != "single"])
def test_strategy_matches_single_on_toy_mlp(name, losses):
    assert losses[name]["train_loss"] == pytest.approx(losses["single"]["train_loss"], rel=1e-4)


def test_hybrid_ran_two_replicas(losses):
    assert losses["hybrid-2x2"]["world_size"] == 2 and losses["hybrid-2x2"]["data_parallel_size"] == 2


def test_pipelining_engine_ran_one_rank_per_stage(losses):
    assert losses["pipelining-gpipe"]["world_size"] == 2 and losses["pipelining-gpipe"]["data_parallel_size"] == 1
    assert losses["pipelining-2x2"]["world_size"] == 4 and losses["pipelining-2x2"]["data_parallel_size"] == 2


def _agree_worker(rank: int, world: int, init: str, out: str) -> None:
    import json

    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    measured = []

    def measure():  # every rank would measure its own split; only rank 0's is used
        measured.append(rank)
        return [1 + rank, 5 - rank]

    counts = agree_on_counts(measure)
    dist.destroy_process_group()
    with open(f"{out}.{rank}", "w") as f:
        json.dump({"counts": counts, "measured": measured}, f)


def test_time_balanced_counts_are_rank_0s_on_every_rank(tmp_path):
    """Two real gloo processes whose own timings would cut differently end with rank 0's cut (only rank 0 measures)."""
    import json

    import torch.multiprocessing as mp

    init = f"file://{tmp_path}/rendezvous"
    mp.spawn(_agree_worker, args=(2, init, str(tmp_path / "out")), nprocs=2, join=True)
    found = [json.loads((tmp_path / f"out.{rank}").read_text()) for rank in range(2)]
    assert [f["counts"] for f in found] == [[1, 5], [1, 5]]
    assert [f["measured"] for f in found] == [[0], []]


TIED = [*COMMON, "model._target_=tests.support.tied_net.TiedNet"]


def test_tied_weights_pipelining_is_refused_before_training_and_trains_when_kept_in_one_stage(tmp_path):
    refused = run_cli(
        [
            *TIED,
            "strategy=pipeline",
            "strategy.engine=pipelining",
            "resources.gpus_per_node=2",
            "strategy.split_points=[out]",
        ],
        tmp_path / "cut",
    )
    out = refused.stdout + refused.stderr
    assert refused.returncode == 2, out
    assert "`strategy.balance`" in out and "'mid.weight' and 'out.weight'" in out and "Fix:" in out, out
    assert "Traceback" not in out and not (tmp_path / "cut" / "checkpoints").exists(), out
    single, kept = tmp_path / "single", tmp_path / "kept"
    assert_ok(run_cli([*TIED, "strategy=single"], single))
    assert_ok(
        run_cli(
            [
                *TIED,
                "strategy=pipeline",
                "strategy.engine=pipelining",
                "resources.gpus_per_node=2",
                "strategy.split_points=[head]",
            ],
            kept,
        )
    )
    assert read_summary(kept)["train_loss"] == pytest.approx(read_summary(single)["train_loss"], rel=1e-4)


@pytest.mark.parametrize("name", ["hybrid-2x2", "pipelining-gpipe"])
def test_bf16_on_multi_rank_strategies(name, losses, tmp_path):
    """bf16 changes the computation of the variant's own fp32 run (same seed, batch and steps: a run that ignored
    the precision would repeat its loss to rounding), and trains as well."""
    assert_ok(run_cli([*COMMON, *VARIANTS[name], "trainer.precision=bf16"], tmp_path / "run"))
    summary, fp32 = read_summary(tmp_path / "run"), losses[name]
    assert summary["global_step"] == 20
    assert abs(summary["train_loss"] - fp32["train_loss"]) > 1e-5, (summary["train_loss"], fp32["train_loss"])
    assert summary["train_loss"] == pytest.approx(fp32["train_loss"], abs=0.05)


@pytest.mark.parametrize(
    "overrides, key",
    [
        (["strategy=model_parallel", "strategy.stages=5"], "strategy.stages"),  # toy_mlp has 4 layers
        (["strategy=pipeline", "strategy.balance=[1,1]", "strategy.stages=2"], "strategy.balance"),  # 2 of 4 layers
        (["strategy=pipeline", "strategy.split_points=[3,1]"], "strategy.split_points"),  # not in forward order
        (["strategy=pipeline", "strategy.split_points=[hidden]"], "strategy.split_points"),  # no such module
    ],
)
def test_splits_the_model_cannot_take_are_refused_before_training(overrides, key, tmp_path):
    """What only the built model can tell (its layers, its module names) is checked at the job's start."""
    run_dir = tmp_path / "run"
    proc = run_cli([*COMMON, *overrides], run_dir)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert f"`{key}`" in proc.stdout + proc.stderr and "Fix:" in proc.stdout + proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr
    assert not (run_dir / "checkpoints").exists() and not (run_dir / "summary.json").exists()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("strategy", ["single", "dp", "ddp", "model_parallel", "pipeline", "hybrid"])
def test_every_strategy_trains_on_gpu(strategy, tmp_path):
    gpus = torch.cuda.device_count()
    extra = ["strategy.stages=2"] if strategy in ("model_parallel", "pipeline", "hybrid") else []
    proc = run_cli(
        [
            "model=resnet18",
            "data=synthetic",
            "trainer.max_steps=5",
            "trainer.epochs=null",
            "trainer.batch_size=32",
            f"strategy={strategy}",
            f"resources.gpus_per_node={max(2, gpus) if strategy == 'hybrid' else gpus}",
            *extra,
        ],
        tmp_path / "run",
        gpus=True,
    )
    assert_ok(proc)
    summary = read_summary(tmp_path / "run")
    assert summary["device"] == "cuda" and summary["global_step"] == 5
