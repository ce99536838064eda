"""Node-seconds lost to one node failure, with replica groups against today's requeue and resume, on the Slurm test
cluster (4 nodes or more: `scripts/slurm_test_cluster.sh start --nodes 4`).

Four jobs of the same training (toy MLP, synthetic data, 2 ranks a node, `--steps` steps, each paced to take
`--step-sleep` s more on every attempt by the user step in pacedstep/), one after the other in the same invocation,
each from an empty queue:

* groups, no failure: `fault_tolerance.replica_groups=3` over 3 nodes and 1 spare (the job holds 4 nodes);
* groups, failure: the same; when the run has logged `--fail-at` steps, group 1's node is set DOWN
  (`scontrol update state=down`) and put back in service 2 s later (a node that reboots);
* requeue, no failure (the reference: plain PyTorch DDP as hpc_train runs it today): ddp over the same 3 nodes,
  a checkpoint every `--checkpoint-every` steps, no spare;
* requeue, failure: the same; the same node failure at the same step. Slurm ends the job (NODE_FAIL) and requeues
  it (``--requeue``); it waits in the queue, starts again, and resumes from its last checkpoint.

For each job, from `sacct --duplicates` (every run of a requeued job, every size of a resized one): the wall time
from submission to the end (queue waits and start-ups included) and the node-seconds the job held (each record's
elapsed seconds x its nodes). The figures: node-seconds lost to the failure = held with the failure minus held
without it, for each way; and the delay (wall with the failure minus without) x the nodes the training needs (3),
which counts the time the run stood still or waited in the queue, when it held nothing. The spare node's cost (the
node-seconds a failure-free run with groups holds beyond the plain one) is reported beside them: what replica groups
pay when nothing fails.

    .venv/bin/python benchmarks/replica_failure.py              # one round, about 5 minutes on 2 cores
    .venv/bin/python benchmarks/replica_failure.py --rounds 2
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import machine_info, run_checked, stats, write_result  # noqa: E402

SLURM = ["launcher=slurm", "cluster.cpus_per_gpu=1", "cluster.time=15", "launcher.signal_delay_s=30"]
NODES = 3  # the training's nodes, both ways


def train(steps: int, every: int) -> List[str]:
    return [
        "model=toy_mlp",
        "data=synthetic",
        f"resources.nodes={NODES}",
        "resources.gpus_per_node=2",
        "trainer.batch_size=48",
        f"trainer.max_steps={steps}",
        "trainer.eval=false",
        "trainer.log_every=1",
        f"trainer.checkpoint_every={every}",
        "trainer.step={_target_:paced_step.paced,_partial_:true}",  # paced on every attempt (pacedstep/)
    ]


GROUPS = ["fault_tolerance.replica_groups=3", "fault_tolerance.timeout_s=10", "fault_tolerance.spare_nodes=1"]


def sh(*command: str) -> str:
    return subprocess.run(command, capture_output=True, text=True).stdout


def wait_idle(timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while sh("squeue", "-h").strip() and time.monotonic() < deadline:
        time.sleep(1)


def steps_logged(run_dir: Path) -> int:
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return 0
    return max(
        (json.loads(line).get("step", 0) for line in path.read_text().splitlines() if '"train"' in line), default=0
    )


def job_node(run_dir: Path, job: str, groups: bool) -> str:
    """The node to fail: group 1's (the agent says where it started each group), or the job's second node."""
    if groups:
        text = "".join(p.read_text() for p in (run_dir / "slurm").glob(f"{job}_0_log.err"))
        return re.search(r"replica group 1 on (\S+)", text).group(1)
    fields = dict(w.split("=", 1) for w in sh("scontrol", "show", "job", "-o", job).split() if "=" in w)
    return sh("scontrol", "show", "hostnames", fields["NodeList"]).split()[1]


def accounting(job: str) -> Dict[str, float]:
    """Wall time from submission to end, and node-seconds held, over every record of the job."""
    deadline = time.monotonic() + 60
    while True:
        lines = sh("sacct", "-j", job, "-X", "-D", "-n", "-P", "-o", "Submit,Start,End,ElapsedRaw,NNodes,State")
        records = [line.split("|") for line in lines.splitlines() if line]
        if records and records[-1][5].startswith("COMPLETED") or time.monotonic() > deadline:
            break
        time.sleep(1)
    stamp = lambda text: time.mktime(time.strptime(text, "%Y-%m-%dT%H:%M:%S"))  # noqa: E731
    held = sum(int(r[3]) * int(r[4]) for r in records)
    return {
        "wall_s": stamp(records[-1][2]) - stamp(records[0][0]),
        "node_s": float(held),
        "records": [r[5] for r in records],
    }


def one_job(name: str, args: List[str], fail_at: int, groups: bool, step_sleep: float) -> Dict[str, float]:
    wait_idle()
    run_dir = Path(tempfile.mkdtemp(prefix=f"replica-{name}-"))
    paced = str(Path(__file__).resolve().parent / "pacedstep")
    env = dict(
        os.environ, BENCH_STEP_S=str(step_sleep), PYTHONPATH=os.pathsep.join([paced, os.environ.get("PYTHONPATH", "")])
    )
    out = run_checked([sys.executable, "-m", "hpc_train.cli", *SLURM, *args, f"hydra.run.dir={run_dir}"], env=env)
    job = re.search(r"submitted Slurm job (\d+)", out.stdout).group(1)
    if fail_at:
        deadline = time.monotonic() + 300
        while steps_logged(run_dir) < fail_at and time.monotonic() < deadline:
            time.sleep(0.2)
        node = job_node(run_dir, job, groups)
        subprocess.run(["scontrol", "update", f"nodename={node}", "state=down", "reason=benchmark"], check=True)
        time.sleep(2)
        subprocess.run(["scontrol", "update", f"nodename={node}", "state=resume"], capture_output=True)
    deadline = time.monotonic() + 900
    while not (run_dir / "summary.json").exists() and time.monotonic() < deadline:
        time.sleep(1)
    wait_idle()
    figures = accounting(job)
    summary = json.loads((run_dir / "summary.json").read_text())
    figures.update(job=job, steps=summary["global_step"], fewer=summary.get("steps_with_fewer_groups"))
    print(f"{name}: {figures}", flush=True)
    return figures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--steps", type=int, default=80)
    parser.add_argument("--fail-at", type=int, default=30)
    parser.add_argument("--checkpoint-every", type=int, default=20)
    parser.add_argument("--step-sleep", type=float, default=0.4)
    args = parser.parse_args()
    base = train(args.steps, args.checkpoint_every)
    runs: Dict[str, List[Dict[str, float]]] = {"groups": [], "groups_failed": [], "requeue": [], "requeue_failed": []}
    for _ in range(args.rounds):
        runs["groups"].append(one_job("groups", [*base, *GROUPS], 0, True, args.step_sleep))
        runs["groups_failed"].append(one_job("groups_failed", [*base, *GROUPS], args.fail_at, True, args.step_sleep))
        runs["requeue"].append(one_job("requeue", base, 0, False, args.step_sleep))
        runs["requeue_failed"].append(one_job("requeue_failed", base, args.fail_at, False, args.step_sleep))
    lost = {
        way: [f["node_s"] - c["node_s"] for f, c in zip(runs[f"{way}_failed"], runs[way])]
        for way in ("groups", "requeue")
    }
    delay = {
        way: [(f["wall_s"] - c["wall_s"]) * NODES for f, c in zip(runs[f"{way}_failed"], runs[way])]
        for way in ("groups", "requeue")
    }
    spare = [g["node_s"] - r["node_s"] for g, r in zip(runs["groups"], runs["requeue"])]
    record = {
        "method": __doc__,
        "settings": vars(args),
        "machine": machine_info(),
        "runs": runs,
        "node_seconds_lost": {way: stats(values) for way, values in lost.items()},
        "delay_node_seconds": {way: stats(values) for way, values in delay.items()},
        "spare_cost_node_seconds": stats(spare),
    }
    path = write_result("replica_failure", record)
    for way in ("groups", "requeue"):
        print(
            f"{way:8s} node-seconds lost {stats(lost[way])['median']:.0f}, delay x {NODES} nodes"
            f" {stats(delay[way])['median']:.0f} node-s"
        )
    print(f"spare node, failure-free run: {stats(spare)['median']:.0f} node-s; results {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
