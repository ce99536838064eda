"""From a laptop over SSH against the same commands on the cluster's login node, in one run.

The laptop and the cluster side are two users of this machine behind a real OpenSSH server
(`scripts/ssh_test_server.sh`, in front of the Slurm test cluster), each with its own Python; the ssh
round trip is the loopback's, so the figure is what hpc_train adds (connection reuse, the sync, the
forwarding), not a network's latency. For each case, rounds alternate laptop / cluster:

1. `hpc-train launcher=slurm dry_run=true` (the laptop: composed here, the partition checks over the open
   connection; the cluster: the same command there with `cluster.login=null`).
2. a 32-job sweep queued (`seed=range(0,32)`, held jobs, cancelled right after): the laptop's command
   syncs the project (nothing changed after the first round), forwards the command line and follows it;
   the figure is the command's wall time until it exits (all 32 queued).
3. `hpc-train-report <the sweep> --no-png` (the laptop: the records mirrored, sacct over the connection).

The connection is opened once before the rounds (as `hpc-train-connect` would). Needs root (runuser,
the test server): `python benchmarks/laptop_latency.py [--rounds 5]`.
"""

from __future__ import annotations

import argparse
import os
import pwd
import re
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Dict, List

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import REPO, fmt_stats, machine_info, paired_ratios, stats, write_result  # noqa: E402

SERVER = REPO / "scripts" / "ssh_test_server.sh"
JOB = ["model=toy_mlp", "strategy=single", "resources.gpus_per_node=1", "launcher=slurm", "cluster=benchsite"]
SWEEP = [*JOB, "+cluster.extra.hold=true", "seed=range(0,32)"]


def server_env() -> Dict[str, str]:
    subprocess.run(["bash", str(SERVER), "start"], check=True, capture_output=True)
    text = subprocess.run(["bash", str(SERVER), "env"], check=True, capture_output=True, text=True).stdout
    return dict(re.findall(r"^export (\w+)=(\S+)$", text, flags=re.M))


def as_user(user: str, args: List[str], cwd: Path, slurm: bool = False) -> float:
    """Wall seconds of ARGS run as USER in a clean environment (it must succeed); ``slurm``: with SLURM_CONF."""
    home = pwd.getpwnam(user).pw_dir
    env = ["env", "-i", f"HOME={home}", f"USER={user}", "PATH=/usr/local/bin:/usr/bin:/bin", "LANG=C.UTF-8"]
    if slurm:
        env.append(f"SLURM_CONF={os.environ.get('SLURM_CONF', '/etc/slurm/slurm.conf')}")
    start = time.perf_counter()
    done = subprocess.run(["runuser", "-u", user, "--", *env, *args], cwd=cwd, capture_output=True, text=True)
    took = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(args)} as {user} failed:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
    return took


def project(env: Dict[str, str], user: str, home: Path, python_of_cluster: str) -> Path:
    """A small project with a profile naming the cluster, owned by ``user``."""
    root = home / f"bench-{uuid.uuid4().hex[:6]}"
    (root / "conf" / "cluster").mkdir(parents=True)
    (root / "conf" / "cluster" / "benchsite.yaml").write_text(
        "defaults:\n  - slurm\n  - _self_\nname: benchsite\ncpus_per_gpu: 1\ntime: '5'\n"
        f"login: {env['HPC_TRAIN_SSH_ALIAS']}\nremote_python: {python_of_cluster}\n"
    )
    (root / "train.py").write_text("print('hello')\n")
    subprocess.run(["chown", "-R", f"{user}:", str(root)], check=True)
    return root


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    env = server_env()
    lap_py, clu_py = env["HPC_TRAIN_SSH_LAPTOP_PYTHON"], env["HPC_TRAIN_SSH_CLUSTER_PYTHON"]
    lap_user, clu_user = env["HPC_TRAIN_SSH_LAPTOP_USER"], env["HPC_TRAIN_SSH_CLUSTER_USER"]
    laptop = project(env, lap_user, Path(pwd.getpwnam(lap_user).pw_dir), clu_py)
    cluster = project(env, clu_user, Path(pwd.getpwnam(clu_user).pw_dir), clu_py)
    cli = ["-m", "hpc_train.cli", "--config-dir", "conf"]
    as_user(lap_user, [lap_py, "-m", "hpc_train.connect", "--config-dir", "conf", "cluster=benchsite"], laptop)
    times: Dict[str, Dict[str, List[float]]] = {
        case: {"laptop": [], "cluster": []} for case in ("dry", "sweep", "report")
    }
    for n in range(args.rounds + 1):  # round 0: warm-up (page cache, the first sync), not counted
        for side, user, python, root, extra in (
            ("laptop", lap_user, lap_py, laptop, []),
            ("cluster", clu_user, clu_py, cluster, ["cluster.login=null"]),
        ):
            sweep_dir = f"multirun/bench-{n}"
            here = side == "cluster"
            took = {
                "dry": as_user(user, [python, *cli, *JOB, *extra, "dry_run=true"], root, here),
                "sweep": as_user(
                    user, [python, *cli, "-m", *SWEEP, *extra, f"hydra.sweep.dir={sweep_dir}"], root, here
                ),
                "report": as_user(user, [python, "-m", "hpc_train.report.command", sweep_dir, "--no-png"], root, here),
            }
            subprocess.run(["scancel", "-u", clu_user], capture_output=True)
            if n:
                for case, seconds in took.items():
                    times[case][side].append(seconds)
    as_user(
        lap_user, [lap_py, "-m", "hpc_train.connect", "--config-dir", "conf", "cluster=benchsite", "--close"], laptop
    )
    record: Dict[str, object] = {"machine": machine_info(), "rounds": args.rounds}
    print(f"{'case':<8} {'laptop (s)':>20} {'cluster (s)':>20} {'laptop / cluster':>20}")
    for case, sides in times.items():
        ratio = stats(paired_ratios(sides["laptop"], sides["cluster"]))
        record[case] = {"laptop": stats(sides["laptop"]), "cluster": stats(sides["cluster"]), "ratio": ratio}
        print(
            f"{case:<8} {fmt_stats(stats(sides['laptop'])):>20} {fmt_stats(stats(sides['cluster'])):>20}"
            f" {fmt_stats(ratio):>20}"
        )
    print(f"written to {write_result('laptop_latency', record)}")
    for root in (laptop, cluster, cluster.parent / "hpc-train" / laptop.name):
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
