"""Login-node latency, two measurements.

1. `hpc-train launcher=slurm dry_run=true`, and the 32-job sweep of part 2 as a dry run (every
   job composed, checked, laid out and its sbatch script rendered), against `python -c "import
   torch"`: fresh processes, run alternately; one warm-up run each (page cache), then `repeats`
   runs; median and min-max.
   With the Slurm test cluster up, the dry run's `sinfo` partition check really asks slurmctld.

2. Submitting a 32-job strategy sweep to the Slurm test cluster:
   `hpc-train -m launcher=slurm strategy=single,dp,ddp,model_parallel seed=range(0,8)` (toy MLP,
   2 GPUs per node, so three distinct layouts and three job arrays) against
   hydra-submitit-launcher submitting the same 32 jobs from a minimal plain Hydra app
   (benchmarks/hsl_app: same sweep axes, one job array with one layout for all jobs).
   Figure: wall time from starting the command until all 32 jobs are listed by `squeue`
   (polled every 0.1 s; both sides measured the same way). hydra-submitit-launcher's command
   does not return after submitting (it waits for the jobs' results), so it is stopped once its
   jobs are queued; hpc-train's command returns by itself (its exit time is recorded too).
   Jobs are submitted held (`--hold` on both sides) so none starts during the measurement,
   and are cancelled with `scancel` right after. Runs alternate hpc-train / hydra-submitit-launcher.

With `--baseline-tree DIR` (another checkout, e.g. `git worktree add /tmp/before <commit>`) both
measurements also run that checkout's hpc-train, interleaved with this one's, and report this /
baseline per pair (the dry run also in CPU seconds: user + system of the command).

Needs the test cluster for part 2: `bash scripts/slurm_test_cluster.sh start`; without it part 2
is reported as not measured.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Dict, Optional

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (
    HERE,
    PYTHON,
    REPO,
    fmt_stats,
    git_commit,
    hpc_train_cmd,
    import_root,
    machine_info,
    row,
    stats,
    write_result,
)  # noqa: E402

FULL = {"repeats": 7, "sweep_repeats": 5}
QUICK = {"repeats": 3, "sweep_repeats": 3}
SWEEP_STRATEGIES = "single,dp,ddp,model_parallel"
SWEEP_SEEDS = 8  # x 4 strategies = 32 jobs
# The same 32-job sweep as a dry run: composed, checked and laid out, every job's sbatch script rendered, nothing
# queued.
SWEEP_DRY_RUN = [
    "-m",
    "launcher=slurm",
    "dry_run=true",
    "model=toy_mlp",
    "data=synthetic",
    "resources.gpus_per_node=2",
    f"strategy={SWEEP_STRATEGIES}",
    f"seed=range(0,{SWEEP_SEEDS})",
]
POLL_S = 0.1
SUBMIT_TIMEOUT_S = 180


# -- the Slurm test cluster -------------------------------------------------------------
def slurm_env(start: bool = False) -> Optional[Dict[str, str]]:
    """The environment that talks to the test cluster, or None when it is not up."""
    script = REPO / "scripts" / "slurm_test_cluster.sh"
    if start:
        subprocess.run(["bash", str(script), "start"], capture_output=True, text=True)
    for _attempt in range(3):  # the test suite may be restarting it right now
        if subprocess.run(["bash", str(script), "status"], capture_output=True, text=True).returncode == 0:
            break
        time.sleep(5)
    else:
        return None
    env = dict(os.environ)
    for line in subprocess.run(["bash", str(script), "env"], capture_output=True, text=True).stdout.splitlines():
        if line.startswith("export ") and "=" in line:
            key, value = line[len("export ") :].split("=", 1)
            env[key] = value.strip("'\"")
    for key in [k for k in env if k.startswith(("SLURM_", "SUBMITIT_")) and k != "SLURM_CONF"]:
        del env[key]
    return env


def queued(name: str, env: Dict[str, str]) -> set:
    out = subprocess.run(["squeue", "-h", "-r", "-n", name, "-o", "%i"], capture_output=True, text=True, env=env).stdout
    return set(out.split())


def cancel(name: str, env: Dict[str, str]) -> None:
    subprocess.run(["scancel", "-n", name], capture_output=True, env=env)
    deadline = time.monotonic() + 30
    while queued(name, env) and time.monotonic() < deadline:
        time.sleep(0.2)


def submit(cmd, name: str, jobs: int, env: Dict[str, str], cwd: Path, wait_exit: bool) -> Dict[str, float]:
    """Start `cmd`; time until `jobs` jobs named `name` are queued (and until it exits, if wait_exit)."""
    log = open(cwd / f"{name}.log", "w")
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, cwd=cwd, stdout=log, stderr=subprocess.STDOUT)
    seen: set = set()
    all_queued = exited = None
    try:
        while True:
            seen |= queued(name, env)
            now = time.perf_counter() - start
            if all_queued is None and len(seen) >= jobs:
                all_queued = now
            if exited is None and proc.poll() is not None:
                exited = now
                if proc.returncode != 0 and all_queued is None:
                    break
            if all_queued is not None and (exited is not None or not wait_exit):
                break
            if now > SUBMIT_TIMEOUT_S:
                break
            time.sleep(POLL_S)
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        log.close()
        cancel(name, env)
    if all_queued is None:
        tail = (cwd / f"{name}.log").read_text()[-3000:]
        raise RuntimeError(f"only {len(seen)} of {jobs} jobs were queued by: {' '.join(map(str, cmd))}\n{tail}")
    return {"all_queued_s": all_queued, "exit_s": exited}


def in_tree(env: Dict[str, str], tree: str) -> Dict[str, str]:
    """The environment that runs another checkout's hpc_train (see --baseline-tree)."""
    return {**env, "PYTHONPATH": str(import_root(Path(tree)))}


def measure_sweep(repeats: int, env: Dict[str, str], baseline_tree: str = "") -> dict:
    jobs = len(SWEEP_STRATEGIES.split(",")) * SWEEP_SEEDS
    hpc, hpc_exit, hsl, base = [], [], [], []
    with tempfile.TemporaryDirectory(prefix="bench-sweep-") as tmp:
        cwd = Path(tmp)

        def hpc_sweep(i: int, tree: str = "") -> Dict[str, float]:
            name = f"bench-hpc-{uuid.uuid4().hex[:8]}"
            return submit(
                hpc_train_cmd(
                    [
                        "-m",
                        "launcher=slurm",
                        "cluster.cpus_per_gpu=1",
                        "cluster.time=5",
                        "+cluster.extra.hold=true",
                        f"job_name={name}",
                        "model=toy_mlp",
                        "data=synthetic",
                        "data.image_size=8",
                        "trainer.max_steps=2",
                        "trainer.epochs=null",
                        "trainer.batch_size=16",
                        f"strategy={SWEEP_STRATEGIES}",
                        "resources.gpus_per_node=2",
                        f"seed=range(0,{SWEEP_SEEDS})",
                        f"hydra.sweep.dir={cwd}/hpc{'-base' if tree else ''}{i}",
                    ]
                ),
                name,
                jobs,
                in_tree(env, tree) if tree else env,
                Path(tree) if tree else cwd,
                wait_exit=True,
            )

        for i in range(repeats):
            r = hpc_sweep(i)
            hpc.append(r["all_queued_s"])
            hpc_exit.append(r["exit_s"])
            if baseline_tree:
                base.append(hpc_sweep(i, baseline_tree)["all_queued_s"])
            name = f"bench-hsl-{uuid.uuid4().hex[:8]}"
            r = submit(
                [
                    PYTHON,
                    str(HERE / "hsl_app" / "app.py"),
                    "-m",
                    f"strategy={SWEEP_STRATEGIES}",
                    f"seed=range(0,{SWEEP_SEEDS})",
                    f"hydra.launcher.name={name}",
                    "+hydra.launcher.additional_parameters.hold=true",
                    f"hydra.sweep.dir={cwd}/hsl{i}",
                ],
                name,
                jobs,
                env,
                cwd,
                wait_exit=False,
            )
            hsl.append(r["all_queued_s"])
    return {
        "jobs": jobs,
        "sweep": f"strategy={SWEEP_STRATEGIES} x seed=range(0,{SWEEP_SEEDS}), resources.gpus_per_node=2, toy_mlp",
        "hpc_train_all_queued_s": stats(hpc),
        "hpc_train_command_exit_s": stats([x for x in hpc_exit if x is not None])
        if any(x is not None for x in hpc_exit)
        else None,
        "hydra_submitit_launcher_all_queued_s": stats(hsl),
        "ratio_hsl_over_hpc": stats([b / a for a, b in zip(hpc, hsl)]),
        **(
            {"baseline_all_queued_s": stats(base), "this_over_baseline": stats([a / b for a, b in zip(hpc, base)])}
            if base
            else {}
        ),
    }


# -- dry run against import torch ------------------------------------------------------
def wall(command, env, cwd=None) -> Dict[str, float]:
    """Wall and CPU seconds (user + system of the command and its children) of one run."""
    cpu0, start = os.times(), time.perf_counter()
    subprocess.run(command, check=True, capture_output=True, env=env, cwd=cwd)
    elapsed, cpu1 = time.perf_counter() - start, os.times()
    return {
        "wall": elapsed,
        "cpu": (cpu1.children_user - cpu0.children_user) + (cpu1.children_system - cpu0.children_system),
    }


def measure_dry_run(repeats: int, env: Dict[str, str], baseline_tree: str = "") -> dict:
    with tempfile.TemporaryDirectory(prefix="bench-dry-") as tmp:
        dry = ["launcher=slurm", "dry_run=true", f"hydra.run.dir={tmp}/run"]
        sweep = [*SWEEP_DRY_RUN, f"hydra.sweep.dir={tmp}/sweep"]
        cases = {
            "dry_run": (hpc_train_cmd(dry), env, None),
            "sweep_dry_run": (hpc_train_cmd(sweep), env, None),
            "import_torch": ([PYTHON, "-c", "import torch"], env, None),
        }
        if baseline_tree:  # the same dry runs from another checkout, in its directory
            cases["baseline"] = (hpc_train_cmd(dry), in_tree(env, baseline_tree), baseline_tree)
            cases["baseline_sweep"] = (hpc_train_cmd(sweep), in_tree(env, baseline_tree), baseline_tree)
        for command, case_env, cwd in cases.values():  # warm the page cache once
            wall(command, case_env, cwd)
        times = {name: [] for name in cases}
        for _ in range(repeats):
            for name, (command, case_env, cwd) in cases.items():
                times[name].append(wall(command, case_env, cwd))
    seconds = {name: [t["wall"] for t in runs] for name, runs in times.items()}
    out = {
        "sweep_dry_run_s": stats(seconds["sweep_dry_run"]),
        "dry_run_s": stats(seconds["dry_run"]),
        "dry_run_cpu_s": stats([t["cpu"] for t in times["dry_run"]]),
        "import_torch_s": stats(seconds["import_torch"]),
        "torch_import_over_dry_run": stats([t / d for d, t in zip(seconds["dry_run"], seconds["import_torch"])]),
    }
    if baseline_tree:
        out["baseline"] = {
            "tree": baseline_tree,
            "commit": git_commit(Path(baseline_tree), mark_dirty=False),
            "dry_run_s": stats(seconds["baseline"]),
            "dry_run_cpu_s": stats([t["cpu"] for t in times["baseline"]]),
            "this_over_baseline_wall": stats([a / b for a, b in zip(seconds["dry_run"], seconds["baseline"])]),
            "this_over_baseline_cpu": stats([a["cpu"] / b["cpu"] for a, b in zip(times["dry_run"], times["baseline"])]),
            "sweep_dry_run_s": stats(seconds["baseline_sweep"]),
            "sweep_this_over_baseline_wall": stats(
                [a / b for a, b in zip(seconds["sweep_dry_run"], seconds["baseline_sweep"])]
            ),
        }
    return out


def table_rows(result: dict) -> list:
    d = result["dry_run"]
    r = d["torch_import_over_dry_run"]
    out = [
        row(
            "login latency",
            "hpc-train launcher=slurm dry_run=true",
            d["dry_run_s"],
            'python -c "import torch"',
            d["import_torch_s"],
            f"{r['median']:.1f}x faster ({r['min']:.1f}-{r['max']:.1f})",
            "s",
            note="" if result["slurm_up"] else "sinfo not answering (no test cluster)",
        )
    ]
    s = result.get("sweep")
    if s and "skipped" not in s:
        q = s["ratio_hsl_over_hpc"]
        out.append(
            row(
                "login latency",
                f"hpc-train -m: {s['jobs']}-job sweep queued",
                s["hpc_train_all_queued_s"],
                "hydra-submitit-launcher, same sweep",
                s["hydra_submitit_launcher_all_queued_s"],
                f"{q['median']:.2f}x faster ({q['min']:.2f}-{q['max']:.2f})",
                "s",
            )
        )
    else:
        out.append(
            row(
                "login latency",
                "hpc-train -m: 32-job sweep queued",
                None,
                "hydra-submitit-launcher, same sweep",
                None,
                (s or {}).get("skipped", "not measured"),
                "s",
            )
        )
    return out


def run(quick: bool = False, repeats: int = 0, start_cluster: bool = False, baseline_tree: str = "") -> dict:
    params = dict(QUICK if quick else FULL)
    if repeats:
        params = {"repeats": repeats, "sweep_repeats": repeats}
    before = machine_info()
    start = time.perf_counter()
    env = slurm_env(start_cluster)
    result = {
        "benchmark": "login_latency",
        "mode": "quick" if quick else "full",
        "machine": before,
        "slurm_up": env is not None,
    }
    baseline_tree = str(Path(baseline_tree).resolve()) if baseline_tree else ""
    result["dry_run"] = measure_dry_run(params["repeats"], env or dict(os.environ), baseline_tree)
    if env is None:
        result["sweep"] = {
            "skipped": "not measured (Slurm test cluster not running: bash scripts/slurm_test_cluster.sh start)"
        }
    else:
        if importlib.util.find_spec("hydra_plugins.hydra_submitit_launcher") is None:
            result["sweep"] = {"skipped": "not measured (pip install -r benchmarks/requirements.txt)"}
        else:
            result["sweep"] = measure_sweep(params["sweep_repeats"], env, baseline_tree)
    result.update(load_after=machine_info()["load_avg_1_5_15"], wall_s=time.perf_counter() - start)
    result["table"] = table_rows(result)
    write_result("login_latency", result)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--repeats", type=int, default=0)
    parser.add_argument("--start-cluster", action="store_true", help="start the Slurm test cluster first (root)")
    parser.add_argument(
        "--baseline-tree",
        default="",
        help="also time another checkout's hpc-train, interleaved (e.g. `git worktree add /tmp/before <commit>`)",
    )
    args = parser.parse_args()
    result = run(args.quick, args.repeats, args.start_cluster, args.baseline_tree)
    d = result["dry_run"]
    print(f"{'command':48s} {'median s (min-max)':>22s}")
    print(f"{'hpc-train launcher=slurm dry_run=true':48s} {fmt_stats(d['dry_run_s']):>22s}")
    ref = 'python -c "import torch" (reference)'
    print(f"{ref:48s} {fmt_stats(d['import_torch_s']):>22s}")
    print(f"{'hpc-train -m, 32-job sweep, dry_run=true':48s} {fmt_stats(d['sweep_dry_run_s']):>22s}")
    if "baseline" in d:
        b = d["baseline"]
        print(f"{'the same dry run at ' + b['commit']:48s} {fmt_stats(b['dry_run_s']):>22s}")
        print(
            f"this / {b['commit']}: wall {fmt_stats(b['this_over_baseline_wall'], 3)}, CPU "
            f"{fmt_stats(b['this_over_baseline_cpu'], 3)}"
        )
        print(f"{'the same sweep dry run at ' + b['commit']:48s} {fmt_stats(b['sweep_dry_run_s']):>22s}")
        print(f"this / {b['commit']}: wall {fmt_stats(b['sweep_this_over_baseline_wall'], 3)}")
    s = result["sweep"]
    if "skipped" in s:
        print(f"sweep submission: {s['skipped']}")
    else:
        print(f"{'hpc-train -m, 32 jobs queued':48s} {fmt_stats(s['hpc_train_all_queued_s']):>22s}")
        print(f"{'hpc-train -m, command exit':48s} {fmt_stats(s['hpc_train_command_exit_s']):>22s}")
        print(
            f"{'hydra-submitit-launcher, 32 jobs queued':48s} "
            f"{fmt_stats(s['hydra_submitit_launcher_all_queued_s']):>22s}"
        )
        if "baseline_all_queued_s" in s:
            print(f"{'hpc-train -m at the baseline, 32 jobs queued':48s} {fmt_stats(s['baseline_all_queued_s']):>22s}")
            print(f"this / baseline: {fmt_stats(s['this_over_baseline'], 3)}")


if __name__ == "__main__":
    main()
