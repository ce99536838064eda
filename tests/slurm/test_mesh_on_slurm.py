"""strategy=mesh on the Slurm test cluster: 2 nodes x 2 GPUs, tensor parallel inside each node and data parallel
across the nodes, trains like one local process.

The ranks are numbered pp, dp_replicate, dp_shard, tp (tp innermost), so a tp group is two consecutive ranks: ranks
0 and 1 on the job's first node, 2 and 3 on its second. AdamW with active clipping (the gradient norm of the toy
model is far above 0.5) checks the one global norm over tp shards and data-parallel ranks.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.slurm.test_slurm import _rank_lines
from tests.support.cli import TINY, assert_ok, final_weights, read_summary, run_cli
from tests.support.slurm import tres_gpus, wait_for_job_end

pytestmark = pytest.mark.slurm

STEPS = 4
TRAIN = [
    *TINY,
    f"trainer.max_steps={STEPS}",
    "trainer.epochs=null",
    "trainer.eval=false",
    "trainer.batch_size=16",
    "trainer.optimizer=adamw",
    "trainer.grad_clip=0.5",
]
MESH = [
    "strategy=mesh",
    "resources.nodes=2",
    "resources.gpus_per_node=2",
    "strategy.tp=2",
    "strategy.tp_plan={1:colwise,3:rowwise}",  # toy_mlp: Flatten, Linear, ReLU, Linear
]
# extra overrides -> the data-parallel dimension across the nodes, as the mesh line names it (dp_replicate x tp is
# the same placement with replicas instead of shards: tests/e2e/test_mesh.py runs it with local ranks)
LAYOUTS = {
    "dp_shard-2-x-tp-2": ([], "dp_shard"),
}


def last_grad_norm(run_dir: Path) -> float:
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r for r in records if r["kind"] == "train"][-1]["grad_norm"]


@pytest.fixture(scope="module")
def single(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("single")
    assert_ok(run_cli([*TRAIN, "strategy=single"], run_dir))
    return run_dir


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_tensor_parallel_in_each_node_data_parallel_across_nodes(layout, slurm_cluster, single, tmp_path):
    from tests.slurm.test_requeue_slurm import submit

    extra, across = LAYOUTS[layout]
    run_dir = tmp_path / "run"
    job = submit([*TRAIN, *MESH, *extra], run_dir)
    fields = wait_for_job_end(job, timeout=120)
    assert fields["JobState"] == "COMPLETED", fields
    assert fields["NumNodes"] == "2" and fields["NumTasks"] == "4", fields
    assert tres_gpus(fields) == 4 and "gpu:2" in fields.get("TresPerNode", ""), fields
    nodes = subprocess.run(
        ["scontrol", "show", "hostnames", fields["NodeList"]], capture_output=True, text=True, check=True
    ).stdout.split()

    ranks = _rank_lines(run_dir)  # (rank, world, local rank, source, host)
    assert [(r[0], r[1], r[2], r[3]) for r in ranks] == [(rank, 4, rank % 2, "srun") for rank in range(4)], ranks
    assert [r[4] for r in ranks] == [nodes[0], nodes[0], nodes[1], nodes[1]], "each tp group inside one node"
    for rank in range(4):
        at = {"dp_replicate": 0, "dp_shard": 0, "tp": rank % 2}
        at[across] = rank // 2
        mesh_line = (
            f"mesh: {across} 2 x tp 2 (this rank at pp=0 dp_replicate={at['dp_replicate']} dp_shard={at['dp_shard']} "
            f"tp={at['tp']})"
        )
        assert mesh_line in (run_dir / "logs" / f"rank{rank}.log").read_text(), (rank, mesh_line)

    summary = read_summary(run_dir)
    assert summary["world_size"] == 4 and summary["global_step"] == STEPS
    assert summary["train_loss"] == pytest.approx(read_summary(single)["train_loss"], abs=1e-4)
    assert last_grad_norm(run_dir) == pytest.approx(last_grad_norm(single), rel=1e-4)
    assert last_grad_norm(single) > 0.5, "the clipping must be active"
    mesh_weights, single_weights = final_weights(run_dir), final_weights(single)
    assert mesh_weights.keys() == single_weights.keys()
    for name, value in single_weights.items():
        assert mesh_weights[name].shape == value.shape, name
        assert (mesh_weights[name] - value).abs().max().item() <= 1e-4, name
