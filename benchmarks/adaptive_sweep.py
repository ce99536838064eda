"""A real tuning problem swept four ways on this machine's CPU: every trial to its full budget, Hydra's Optuna
sweeper in batches, hpc-train's adaptive sweeper without a scheduler and with ASHA.

The problem: the toy MLP (two linear layers) on scikit-learn's bundled digits at 16 x 16 px, batch 256, SGD with a
constant learning rate, ranked by `eval_loss` on the fixed validation split after `trainer.max_steps` (81, about 14
epochs). The grid: `trainer.lr` (8 values) x `trainer.momentum` (4) x `model.hidden` (2) = 64 configurations. Every
contender sweeps the same grid with the same slots (2: one training process a core, OMP_NUM_THREADS=1), one after
the other in one invocation:

1. exhaustive: `hydra/sweeper=adaptive sampler=grid scheduler.name=none`: every configuration to 81 steps, a free
   slot refilled at once. Its best is the known best. With the grid sampler, contender 3 of the brief (this sweeper
   without a scheduler, the same sampler as ASHA's) is this same command, so it runs once;
2. hydra-optuna: `hydra/sweeper=optuna hydra/sweeper/sampler=grid n_jobs=2` with `hydra/launcher=joblib
   n_jobs=2` (hpc-train's own launcher runs a local batch one job after another): every configuration to 81
   steps, in batches of 2 that wait for their slower job;
3. asha: `hydra/sweeper=adaptive sampler=grid scheduler.name=asha min_resource=3 max_resource=81 eta=3`: rungs of
   3, 9, 27 and 81 steps, a promoted trial resuming its checkpoint.

Measured per contender, from the records the runs write (attempts.jsonl: each attempt's start and end, written by
the training process itself, so Python's, Hydra's and torch's start-up is outside it): trial-seconds (the sum of
every attempt's seconds: the adaptive journal's rung_seconds, which is cross-checked), wall time (the command's
start to its exit), the best full-budget value found, when a configuration within `--tolerance` (1 %) of the
exhaustive best first completed (wall and trial-seconds by then), idle slot-seconds (slots x wall minus the
attempts' seconds) and, of those, the start-up (a rung started by the controller, or a Hydra job's .hydra files
written, to its attempt's start) and the rest (no process of the sweep on the slot: batch barrier, polling, the
command's own start and end). The machine's CPU busy fraction during each contender is recorded: trial-seconds are
comparable within one run, not across machines or loads.

    .venv/bin/python benchmarks/adaptive_sweep.py            # 64 configurations (29 min on the loaded 2-core VM)
    .venv/bin/python benchmarks/adaptive_sweep.py --quick    # 8 configurations, 27 steps (4.5 min there)

--lrs, --momenta, --widths, --image-size and --steps MIN,MAX choose another grid, a costlier step and other rungs
(docs/benchmarks.md: a problem whose steps outweigh a rung's fixed cost); --only adds hyperband.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Sequence, Tuple

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import REPO, _busy_seconds, cpu_env, hpc_train_cmd, machine_info, write_result  # noqa: E402

BASE = [
    "model=toy_mlp",
    "data=digits",
    "strategy=single",
    "trainer.batch_size=256",
    "trainer.epochs=null",
    "trainer.lr_schedule=constant",
    "trainer.weight_decay=0",
    "trainer.eval_every=100000",  # one evaluation, at the end of each rung
    "trainer.checkpoint_every=0",  # the end of a rung writes the checkpoint a promotion resumes
    "trainer.progress=false",
]
FULL = {
    "trainer.lr": [0.005, 0.01, 0.02, 0.05, 0.1, 0.15, 0.2, 0.3],
    "trainer.momentum": [0.0, 0.5, 0.8, 0.9],
    "model.hidden": [256, 1024],
}
QUICK = {"trainer.lr": [0.01, 0.05, 0.2, 0.3], "trainer.momentum": [0.0, 0.9], "model.hidden": [256]}
CONTENDERS = ("exhaustive", "hydra-optuna", "asha", "hyperband")  # hyperband: asked for with --only


# -- the commands -----------------------------------------------------------------------------------
def _choices(space: Dict[str, List[float]]) -> List[str]:
    return [f"{key}=choice({','.join(str(v) for v in values)})" for key, values in space.items()]


def command(name: str, space: Dict[str, List[float]], args: argparse.Namespace, sweep: Path) -> List[str]:
    """The contender's hpc-train multirun: the same grid, budget and slots for every one."""
    trials = len(list(itertools.product(*space.values())))
    common = ["-m", *BASE, f"data.image_size={args.image_size}", f"trainer.max_steps={args.max_steps}"]
    common += [*_choices(space), f"hydra.sweep.dir={sweep}"]
    if name == "hydra-optuna":
        return hpc_train_cmd(
            [
                *common,
                "hydra/sweeper=optuna",
                "hydra/sweeper/sampler=grid",
                f"+hydra.sweeper.sampler.seed={args.seed}",
                f"hydra.sweeper.n_trials={trials}",
                f"hydra.sweeper.n_jobs={args.slots}",
                "hydra/launcher=joblib",
                f"hydra.launcher.n_jobs={args.slots}",
            ]
        )
    scheduler = "none" if name == "exhaustive" else name  # asha or hyperband
    return hpc_train_cmd(
        [
            *common,
            "hydra/sweeper=adaptive",
            "hydra.sweeper.sampler=grid",
            f"hydra.sweeper.seed={args.seed}",
            f"hydra.sweeper.max_trials={trials}",
            f"hydra.sweeper.max_concurrent={args.slots}",
            f"hydra.sweeper.max_failures={trials}",
            f"hydra.sweeper.poll_s={args.poll_s}",
            f"hydra.sweeper.scheduler.name={scheduler}",
            f"hydra.sweeper.scheduler.min_resource={args.min_steps}",
            f"hydra.sweeper.scheduler.max_resource={args.max_steps}",
            "hydra.sweeper.scheduler.eta=3",
        ]
    )


def run_contender(cmd: List[str], timeout: float) -> Dict[str, float]:
    """The command run to its exit: its start and exit (epoch seconds) and the machine's CPU busy fraction meanwhile."""
    env = cpu_env(1)
    env.pop("HPC_TRAIN_FORK_SERVER", None)  # a test facility: every rung starts a fresh process, as for a user
    busy0, t0 = _busy_seconds(), time.time()
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)
    t1 = time.time()
    if proc.returncode != 0:
        raise SystemExit(f"failed ({proc.returncode}): {' '.join(cmd)}\n{(proc.stdout + proc.stderr)[-4000:]}")
    busy = (_busy_seconds() - busy0) / (t1 - t0) / (os.cpu_count() or 1)
    return {"t0": t0, "t1": t1, "machine_cpu_busy": round(busy, 3)}


# -- what the runs recorded ---------------------------------------------------------------------------
def attempts(run_dir: Path) -> List[Tuple[float, float]]:
    """Each attempt's (start, end), from the run's own attempts.jsonl (an attempt without an end is left out)."""
    spans, begun = [], None
    path = run_dir / "attempts.jsonl"
    for line in path.read_text().splitlines() if path.exists() else []:
        event = json.loads(line)
        if event.get("event") == "start":
            begun = float(event["time"])
        elif event.get("event") == "end" and begun is not None:
            spans.append((begun, float(event["time"])))
            begun = None
    return spans


def adaptive_trials(sweep: Path) -> List[dict]:
    """Each trial of an adaptive study: params, rungs' starts (when the controller started each), attempts, the
    full-budget value if it completed, and the journal's rung_seconds."""
    from hpc_train.jobs.study import trial_rows

    rows = trial_rows(sweep) or []
    return [
        {
            "params": row["params"],
            "starts": [row["rung_times"][k][0] for k in sorted(row["rung_times"])],
            "attempts": attempts(sweep / str(row["number"])),
            "value": row["value"],
            "rung_values": row["rung_values"],
            "journal_seconds": sum(row["rung_seconds"].values()),
        }
        for row in rows
    ]


def hydra_trials(sweep: Path, keys: Sequence[str]) -> List[dict]:
    """Each job of a Hydra sweep: params (from its overrides), its start (its .hydra files written), attempts, value."""
    found = []
    for run_dir in sorted((p for p in sweep.iterdir() if p.name.isdigit()), key=lambda p: int(p.name)):
        overrides = (run_dir / ".hydra" / "overrides.yaml").read_text().splitlines()
        pairs = [line.lstrip("- ").split("=", 1) for line in overrides if "=" in line]
        summary = json.loads((run_dir / "summary.json").read_text())
        found.append(
            {
                "params": {k: float(v) for k, v in pairs if k in keys},
                "starts": [(run_dir / ".hydra" / "overrides.yaml").stat().st_mtime],
                "attempts": attempts(run_dir),
                "value": summary["eval_loss"],
                "rung_values": {},
                "journal_seconds": None,
            }
        )
    return found


# -- the measures ---------------------------------------------------------------------------------------
def _overlap(spans: Sequence[Tuple[float, float]], until: float) -> float:
    return sum(max(0.0, min(end, until) - start) for start, end in spans)


def _startups(trial: dict) -> List[float]:
    """Each rung's start-up: from its start to the first attempt that began after it."""
    gaps = []
    for start in trial["starts"]:
        later = [a for a, _ in trial["attempts"] if a >= start - 0.5]
        if later:
            gaps.append(min(later) - start)
    return gaps


def measures(trials: List[dict], run: Dict[str, float], slots: int, best: float, tolerance: float) -> dict:
    t0, wall = run["t0"], run["t1"] - run["t0"]
    spans = [span for trial in trials for span in trial["attempts"]]
    busy = sum(end - start for start, end in spans)
    completed = [(trial["attempts"][-1][1], trial) for trial in trials if trial["value"] is not None]
    hits = sorted(at for at, trial in completed if trial["value"] <= best + tolerance * abs(best))
    found = min(completed, key=lambda pair: pair[1]["value"])[1] if completed else None
    startups = [gap for trial in trials for gap in _startups(trial)]
    journal = [trial["journal_seconds"] for trial in trials if trial["journal_seconds"] is not None]
    idle = slots * wall - busy
    return {
        "wall_s": round(wall, 1),
        "trial_s": round(busy, 1),
        "journal_rung_seconds": round(sum(journal), 1) if journal else None,
        "trials": len(trials),
        "rungs": len(spans),
        "completed": len(completed),
        "best_value": found["value"] if found else None,
        "best_params": found["params"] if found else None,
        "within_tolerance_wall_s": round(hits[0] - t0, 1) if hits else None,
        "within_tolerance_trial_s": round(_overlap(spans, hits[0]), 1) if hits else None,
        "idle_slot_s": round(idle, 1),
        "startup_slot_s": round(sum(startups), 1),
        "startup_per_rung_s": round(sum(startups) / len(startups), 2) if startups else None,
        "no_process_slot_s": round(idle - sum(startups), 1),
        "machine_cpu_busy": run["machine_cpu_busy"],
    }


def per_trial(trials: List[dict], t0: float) -> List[dict]:
    """Each trial as recorded: params, rung values, each rung's start and its attempts (seconds after the command's
    start)."""
    return [
        {
            "params": trial["params"],
            "rung_values": trial["rung_values"],
            "value": trial["value"],
            "starts": [round(at - t0, 2) for at in trial["starts"]],
            "attempts": [[round(a - t0, 2), round(b - t0, 2)] for a, b in trial["attempts"]],
        }
        for trial in trials
    ]


def landscape(trials: List[dict]) -> List[dict]:
    """The exhaustive run's value of every configuration, best first."""
    rows = [{"params": trial["params"], "value": trial["value"]} for trial in trials if trial["value"] is not None]
    return sorted(rows, key=lambda row: row["value"])


# -- the benchmark ----------------------------------------------------------------------------------------
def sweep_one(name: str, space: dict, args: argparse.Namespace, work: Path) -> Tuple[List[dict], Dict[str, float]]:
    sweep = work / name
    cmd = command(name, space, args, sweep)
    print(f"{name}: {' '.join(cmd[2:])}", flush=True)
    run = run_contender(cmd, args.timeout)
    trials = hydra_trials(sweep, list(space)) if name == "hydra-optuna" else adaptive_trials(sweep)
    run["command"] = " ".join(["hpc-train", *cmd[3:]])
    return trials, run


def table(results: Dict[str, dict]) -> str:
    head = ["contender", "trial-s", "wall s", "best", "to 1 %: wall s", "to 1 %: trial-s", "idle slot-s", "start-up"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, m in results.items():
        cells = [name, m["trial_s"], m["wall_s"], f"{m['best_value']:.4f}", m["within_tolerance_wall_s"]]
        cells += [m["within_tolerance_trial_s"], m["idle_slot_s"], m["startup_slot_s"]]
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    return "\n".join(lines)


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="8 configurations, rungs of 3, 9 and 27 steps")
    parser.add_argument("--slots", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0, help="the grid samplers' seed (the order of the grid)")
    parser.add_argument("--poll-s", type=float, default=1.0, help="the adaptive controller's poll_s")
    parser.add_argument("--tolerance", type=float, default=0.01, help="within this fraction of the known best")
    parser.add_argument("--only", default=",".join(CONTENDERS[:3]), help="comma-separated subset (exhaustive first)")
    parser.add_argument("--widths", default=None, help="model.hidden's values, comma-separated (default 256,1024)")
    parser.add_argument("--lrs", default=None, help="trainer.lr's values, comma-separated (default: 8 from 0.005)")
    parser.add_argument("--momenta", default=None, help="trainer.momentum's values (default 0,0.5,0.8,0.9)")
    parser.add_argument("--image-size", type=int, default=16, help="data.image_size: the step's compute grows with it")
    parser.add_argument("--steps", default=None, help="MIN,MAX: the first rung's and the full budget (default 3,81)")
    parser.add_argument("--timeout", type=float, default=3600, help="seconds, per contender")
    parser.add_argument("--out", default=None, help="results/<out>.json (default adaptive_sweep[_quick])")
    args = parser.parse_args()
    args.max_steps, args.min_steps = (27, 3) if args.quick else (81, 3)
    if args.steps:
        args.min_steps, args.max_steps = (int(n) for n in args.steps.split(","))
    args.out = args.out or ("adaptive_sweep_quick" if args.quick else "adaptive_sweep")
    return args


def main() -> None:
    args = parse()
    space = dict(QUICK if args.quick else FULL)
    for key, given, kind in (("trainer.lr", args.lrs, float), ("trainer.momentum", args.momenta, float)):
        if given:
            space[key] = [kind(v) for v in given.split(",")]
    if args.widths:
        space["model.hidden"] = [int(w) for w in args.widths.split(",")]
    names = [n for n in args.only.split(",") if n]
    if names[0] != "exhaustive" or not set(names) <= set(CONTENDERS):
        raise SystemExit(f"--only: exhaustive first (its best is the known best), then any of {CONTENDERS[1:]}")
    record = {"benchmark": "adaptive_sweep", "config": vars(args) | {"space": space}, "machine": machine_info(1.0)}
    started, results, runs, record["trials"] = time.time(), {}, {}, {}
    record |= {"runs": runs, "results": results}
    with tempfile.TemporaryDirectory(prefix="adaptive_sweep") as tmp:
        for name in names:
            trials, runs[name] = sweep_one(name, space, args, Path(tmp))
            if name == "exhaustive":
                record["landscape"] = landscape(trials)
                best = record["landscape"][0]["value"]
            record["trials"][name] = per_trial(trials, runs[name]["t0"])
            results[name] = measures(trials, runs[name], args.slots, best, args.tolerance)
            write_result(args.out, record)  # each contender's records kept as soon as it ended
            print(json.dumps(results[name]), flush=True)
    record["total_s"] = round(time.time() - started, 1)
    record["machine"]["load_avg_after"] = os.getloadavg()
    path = write_result(args.out, record)
    print(table(results))
    print(f"written: {path}")


if __name__ == "__main__":
    main()
