"""A sweep of many short one-GPU runs on the Slurm test cluster: packed into a few allocations against job arrays.

The same sweep, `hpc-train -m launcher=slurm strategy=single seed=range(0,N) -- task.py S` (a script that sleeps
S seconds; each run one GPU), is submitted two ways in the same invocation, alternately:

* packed: `launcher.pack.allocations=A launcher.pack.gpus_per_node=G` (A Slurm jobs, each a pool starting its
  runs as `srun --exact` job steps);
* array: today's default, one array task per run.

Measured from the moment the benchmark starts the hpc-train command: when it exits, when every run has ended (the
last run's `summary.json` seen, polled every 0.25 s; the last run's own end time from its `attempts.jsonl` too) and
when the sweep's last Slurm job has left `squeue` (polled every second). Packed: from each allocation's events file,
the refill gap (a run's `started` minus the `ended` that freed its slot), each run's start relative to its
allocation's `began`, and the step start (`started` to the run's own first line in `attempts.jsonl`: srun creating
the step, then Python starting); the pool's CPU (read from /proc while it runs). Array: each job's queue wait
(sacct Submit to Start, whole seconds) and its start (sacct Start to the run's first line). Both: the turnaround
between runs on a GPU (a run's last line to the next run's first line, from the runs' own records), and GPU-seconds
held (sacct Elapsed x GPUs) against GPU-seconds in runs. Before each side it waits (at most `--idle-wait` s) until no
other job is in the queue, and records the other jobs it saw during the side and the machine's CPU busy fraction.
Also recorded: the test cluster's scheduler settings (`scontrol show config`) and nodes, on which every figure
here depends.

    .venv/bin/python benchmarks/pack_sweep.py                    # 200 runs x 2 s, 2 rounds (~8 min on 2 cores)
    .venv/bin/python benchmarks/pack_sweep.py --runs 40 --rounds 1
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import _busy_seconds, hpc_train_cmd, machine_info, write_result

SIDES = ("packed", "array")
POLL_S = 0.25
QUEUE_POLL_S = 1.0
SLURM_SETTINGS = (
    "SLURM_VERSION",
    "SchedulerType",
    "SchedulerParameters",
    "SelectType",
    "SelectTypeParameters",
    "PriorityType",
    "BatchStartTimeout",
    "MessageTimeout",
    "KillWait",
    "MinJobAge",
    "ProctrackType",
    "TaskPlugin",
    "PrologFlags",
    "JobAcctGatherType",
    "MaxArraySize",
    "MaxJobCount",
)
TASK = "import sys, time\ntime.sleep(float(sys.argv[1]))\n"


# -- Slurm ------------------------------------------------------------------------------------
def slurm_settings() -> dict[str, object]:
    """The controller's settings that decide how fast jobs and steps start, and the nodes."""
    settings: dict[str, object] = {}
    for line in subprocess.run(
        ["scontrol", "show", "config"], capture_output=True, text=True, check=False
    ).stdout.splitlines():
        key, _, value = line.partition("=")
        if key.strip() in SLURM_SETTINGS:
            settings[key.strip()] = value.strip()
    nodes = subprocess.run(
        ["sinfo", "-h", "-N", "-p", "debug", "-o", "%N %c %G %m"], capture_output=True, text=True, check=False
    )
    settings["nodes"] = nodes.stdout.split("\n")[:-1]
    return settings


def queue() -> list[list[str]]:
    """[job id, name, state] of every job in the queue (arrays' pending tasks as one line)."""
    out = subprocess.run(["squeue", "-h", "-o", "%i|%j|%T"], capture_output=True, text=True, check=False).stdout
    return [line.split("|") for line in out.splitlines() if line.count("|") == 2]


def _epoch(text: str) -> float | None:
    try:
        return datetime.datetime.strptime(text, "%Y-%m-%dT%H:%M:%S").timestamp()
    except ValueError:
        return None


def _seconds(elapsed: str) -> int:
    days, _, clock = elapsed.rpartition("-")
    parts = [int(p) for p in clock.split(":")]
    while len(parts) < 3:
        parts.insert(0, 0)
    return int(days or 0) * 86400 + parts[0] * 3600 + parts[1] * 60 + parts[2]


def ours(job_name: str, name: str) -> bool:
    """A job of the sweep named `name`: its array, or one of its allocations (`<name>-pack<k>`)."""
    return job_name == name or job_name.startswith(f"{name}-pack")


def accounting(name: str, allocations: int) -> list[dict[str, object]]:
    """sacct's allocations (no steps) of the sweep's jobs: times, state, GPUs."""
    names = ",".join([name, *(f"{name}-pack{k}" for k in range(allocations))])
    out = subprocess.run(
        [
            "sacct",
            "-n",
            "-P",
            "-X",
            "--name",
            names,
            "-S",
            "now-1hour",
            "-o",
            "JobID,Submit,Start,End,State,Elapsed,AllocTRES",
        ],
        capture_output=True,
        text=True,
        check=False,
    ).stdout
    rows = []
    for line in out.splitlines():
        job, submit, start, end, state, elapsed, tres = line.split("|")
        gpus = next((int(t.split("=")[1]) for t in tres.split(",") if t.startswith("gres/gpu=")), 0)
        rows.append(
            {
                "job": job,
                "submit": _epoch(submit),
                "start": _epoch(start),
                "end": _epoch(end),
                "state": state,
                "elapsed_s": _seconds(elapsed),
                "gpus": gpus,
            }
        )
    return rows


# -- what the runs recorded ---------------------------------------------------------------
def attempts(run_dir: Path) -> dict[str, float | None]:
    """The run's own first line and last line (hpc-train's attempts.jsonl), wall-clock times."""
    start = end = None
    path = run_dir / "attempts.jsonl"
    if path.exists():
        for line in path.read_text().splitlines():
            event = json.loads(line)
            if event.get("event") == "start" and start is None:
                start = event["time"]
            elif event.get("event") == "end":
                end = event["time"]
    return {"start": start, "end": end}


def pack_events(sweep: Path) -> dict[int, list[dict]]:
    folder = sweep / ".hpc_train" / "pack"
    found = {}
    for path in sorted(folder.glob("allocation_*.events.jsonl")):
        index = int(path.name.split("_")[1].split(".")[0])
        found[index] = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return found


def refill(events: list[dict]) -> dict[str, list[float]]:
    """Per allocation: each run's start after `began`; each refill gap (a start after an `ended` that freed a slot)."""
    began = next(e["time"] for e in events if e["event"] == "began")
    freed: list[float] = []  # ended times not yet taken by a start (identical one-GPU runs: any slot fits any run)
    gaps, after_began, initial = [], [], []
    for event in events:
        if event["event"] == "ended":
            freed.append(event["time"])
        elif event["event"] == "started":
            after_began.append(event["time"] - began)
            if freed:
                gaps.append(event["time"] - freed.pop(0))
            else:
                initial.append(event["time"] - began)
    return {"gaps": gaps, "start_after_began": after_began, "initial_start_after_began": initial}


def turnaround(runs: Sequence[dict[str, float | None]]) -> list[float]:
    """Dead time between runs on a GPU, from the runs' own records: each start after the first wave is matched with
    the earliest run end not yet matched (the GPU it freed), and the gap between the run's last line and the next
    run's first line is taken. Everything between two runs counts: Slurm ending a job and starting the next, or the
    pool noticing the end and starting a step, and Python starting."""
    points = sorted([(r["end"], 0) for r in runs if r["end"]] + [(r["start"], 1) for r in runs if r["start"]])
    freed: list[float] = []
    gaps = []
    for at, is_start in points:
        if not is_start:
            freed.append(at)
        elif freed:
            gaps.append(at - freed.pop(0))
    return gaps


def dist(values: Sequence[float], digits: int = 3) -> dict[str, float] | None:
    values = sorted(float(v) for v in values)
    if not values:
        return None

    def pick(q: float) -> float:
        return values[min(len(values) - 1, int(q * len(values)))]

    return {
        "n": len(values),
        "median": round(statistics.median(values), digits),
        "p90": round(pick(0.9), digits),
        "min": round(values[0], digits),
        "max": round(values[-1], digits),
        "mean": round(statistics.mean(values), digits),
    }


# -- one side ------------------------------------------------------------------------------------
class PoolCpu:
    """CPU seconds of the sweep's pool processes (hpc_train.pack.scheduler of its plans), read from /proc while they
    run."""

    def __init__(self, sweep: Path) -> None:
        self.marker: bytes = str(sweep).encode()
        self.seen: dict[int, float] = {}  # pid -> CPU seconds last read
        self.tick = os.sysconf("SC_CLK_TCK")

    def sample(self) -> None:
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit():
                continue
            try:
                cmdline = Path(entry.path, "cmdline").read_bytes()
                if b"hpc_train.pack.scheduler" not in cmdline or self.marker not in cmdline:
                    continue
                fields = Path(entry.path, "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            self.seen[int(entry.name)] = (int(fields[11]) + int(fields[12])) / self.tick  # utime + stime

    def total(self) -> float:
        return round(sum(self.seen.values()), 2)


def wait_for_empty_queue(limit_s: float) -> dict[str, object]:
    start = time.monotonic()
    while queue() and time.monotonic() - start < limit_s:
        time.sleep(2)
    return {"waited_s": round(time.monotonic() - start, 1), "jobs_left": len(queue())}


def run_side(side: str, tag: str, work: Path, args: argparse.Namespace) -> dict:
    name, sweep = f"pb{os.getpid()}-{tag}", work / tag
    overrides = [
        "-m",
        "launcher=slurm",
        "strategy=single",
        f"seed=range(0,{args.runs})",
        f"job_name={name}",
        f"cluster.time={args.time}",
        f"hydra.sweep.dir={sweep}",
    ]
    if side == "packed":
        overrides += [
            f"launcher.pack.allocations={args.allocations}",
            f"launcher.pack.gpus_per_node={args.gpus_per_node}",
        ]
    command = hpc_train_cmd([*overrides, "--", "task.py", str(args.seconds)])
    idle = wait_for_empty_queue(args.idle_wait)
    pool = PoolCpu(sweep)
    busy0, t0 = _busy_seconds(), time.time()
    proc = subprocess.Popen(command, cwd=work, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    cmd_exit = all_ended = queue_empty = None
    done: dict[int, float] = {}
    others_running, others_seen = 0, set()
    next_queue = 0.0
    while True:
        now = time.time()
        if cmd_exit is None and proc.poll() is not None:
            cmd_exit = now - t0
            output = proc.stdout.read() if proc.stdout else ""
            if proc.returncode != 0:
                raise SystemExit(f"{side}: hpc-train failed ({proc.returncode}):\n{output[-3000:]}")
        for i in range(args.runs):
            if i not in done and (sweep / str(i) / "summary.json").exists():
                done[i] = now - t0
        if all_ended is None and len(done) == args.runs:
            all_ended = now - t0
        if now >= next_queue:
            next_queue = now + QUEUE_POLL_S
            jobs = queue()
            mine = [j for j in jobs if ours(j[1], name)]
            others = [j for j in jobs if not ours(j[1], name)]
            others_seen.update(j[0] for j in others)
            others_running = max(others_running, sum(j[2] == "RUNNING" for j in others))
            if side == "packed":
                pool.sample()
            if cmd_exit is not None and not mine and queue_empty is None:
                queue_empty = now - t0
        if all_ended is not None and queue_empty is not None:
            break
        if now - t0 > args.side_timeout:
            subprocess.run(["scancel", "-n", name], check=False)
            break
        time.sleep(POLL_S)
    wall = time.time() - t0
    busy = (_busy_seconds() - busy0) / wall / (os.cpu_count() or 1)
    return summarise(
        side,
        name,
        sweep,
        t0,
        args,
        {
            "command": " ".join(command[2:]),
            "job_name": name,
            "queue_before": idle,
            "command_exit_s": round(cmd_exit, 2) if cmd_exit is not None else None,
            "all_runs_ended_s": round(all_ended, 2) if all_ended is not None else None,
            "queue_empty_s": round(queue_empty, 2) if queue_empty is not None else None,
            "runs_ended": len(done),
            "timed_out": all_ended is None,
            "other_jobs_seen": len(others_seen),
            "other_jobs_running_max": others_running,
            "machine_cpu_busy": round(busy, 3),
            "pool_cpu_s": pool.total() if side == "packed" else None,
        },
    )


def summarise(side: str, name: str, sweep: Path, t0: float, args: argparse.Namespace, record: dict) -> dict:
    runs = {i: attempts(sweep / str(i)) for i in range(args.runs)}
    starts = [r["start"] - t0 for r in runs.values() if r["start"]]
    ends = [r["end"] for r in runs.values() if r["end"]]
    run_seconds = [r["end"] - r["start"] for r in runs.values() if r["start"] and r["end"]]
    time.sleep(2)  # sacct sees the last End a moment after the job left the queue
    jobs = accounting(name, args.allocations)
    record.update(
        {
            "last_run_end_s": round(max(ends) - t0, 2) if ends else None,
            "first_run_start_s": round(min(starts), 2) if starts else None,
            "run_s": dist(run_seconds),
            "turnaround_s": dist(turnaround(list(runs.values()))),
            "runs_start_end_s": [
                [round(r["start"] - t0, 2) if r["start"] else None, round(r["end"] - t0, 2) if r["end"] else None]
                for r in runs.values()
            ],
            "gpu_s_in_runs": round(sum(run_seconds), 1),
            "gpu_s_held": sum(j["elapsed_s"] * j["gpus"] for j in jobs),
            "slurm_jobs": len(jobs),
            "slurm_states": {s: sum(j["state"] == s for j in jobs) for s in sorted({j["state"] for j in jobs})},
        }
    )
    if side == "array":
        by_task = {j["job"].rsplit("_", 1)[-1]: j for j in jobs if "_" in j["job"]}
        record["queue_wait_s"] = dist([j["start"] - j["submit"] for j in jobs if j["start"] and j["submit"]], 1)
        record["job_start_to_run_start_s"] = dist(
            [
                runs[int(k)]["start"] - j["start"]
                for k, j in by_task.items()
                if k.isdigit() and int(k) in runs and runs[int(k)]["start"] and j["start"]
            ],
            2,
        )
        return record
    events = pack_events(sweep)
    per = {k: refill(ev) for k, ev in events.items()}
    started = {e["run"]: e["time"] for ev in events.values() for e in ev if e["event"] == "started"}
    record.update(
        {
            "allocations": [
                {
                    "index": k,
                    "job": next((e.get("job_id") for e in ev if e["event"] == "began"), None),
                    "began_s": round(next(e["time"] for e in ev if e["event"] == "began") - t0, 2),
                    "finished_s": round(max(e["time"] for e in ev) - t0, 2),
                    "runs": sum(e["event"] == "started" for e in ev),
                    "refill_gap_s": dist(per[k]["gaps"]),
                    "initial_start_after_began_s": dist(per[k]["initial_start_after_began"]),
                    "not_completed": next((e.get("not_completed") for e in ev if e["event"] == "finished"), None),
                }
                for k, ev in sorted(events.items())
            ],
            "queue_wait_s": dist([j["start"] - j["submit"] for j in jobs if j["start"] and j["submit"]], 1),
            "refill_gap_s": dist([g for p in per.values() for g in p["gaps"]]),
            "start_after_began_s": dist([s for p in per.values() for s in p["start_after_began"]], 2),
            "step_start_to_run_start_s": dist(
                [runs[int(job)]["start"] - at for job, at in started.items() if runs.get(int(job), {}).get("start")], 2
            ),
        }
    )
    return record


# -- the benchmark -------------------------------------------------------------------------------
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--seconds", type=float, default=2.0, help="each run's task: sleep this long")
    parser.add_argument("--allocations", type=int, default=4)
    parser.add_argument("--gpus-per-node", type=int, default=4)
    parser.add_argument(
        "--time", type=int, default=30, help="minutes: cluster.time of both sides (the allocations' too)"
    )
    parser.add_argument("--rounds", type=int, default=2, help="rounds of both sides; the first side alternates")
    parser.add_argument(
        "--idle-wait", type=float, default=120, help="seconds to wait for other jobs to leave the queue"
    )
    parser.add_argument("--side-timeout", type=float, default=400)
    parser.add_argument("--out", default="pack_sweep")
    args = parser.parse_args()
    record = {
        "benchmark": "pack_sweep",
        "config": vars(args),
        "machine": machine_info(busy_seconds=1.0),
        "slurm": slurm_settings(),
        "rounds": [],
    }
    started = time.time()
    with tempfile.TemporaryDirectory(prefix="pack_sweep") as tmp:
        work = Path(tmp)
        (work / "task.py").write_text(TASK)
        for r in range(args.rounds):
            order = SIDES if r % 2 == 0 else SIDES[::-1]
            round_record = {}
            for side in order:
                print(f"round {r + 1}: {side} ({args.runs} runs x {args.seconds:g} s)", flush=True)
                round_record[side] = run_side(side, f"{side}{r}", work, args)
                print(
                    json.dumps(
                        {
                            k: round_record[side][k]
                            for k in (
                                "command_exit_s",
                                "all_runs_ended_s",
                                "last_run_end_s",
                                "queue_empty_s",
                                "timed_out",
                                "other_jobs_seen",
                                "machine_cpu_busy",
                                "turnaround_s",
                            )
                        }
                    ),
                    flush=True,
                )
            round_record["order"] = list(order)
            record["rounds"].append(round_record)
    record["total_s"] = round(time.time() - started, 1)
    record["machine"]["load_avg_after"] = os.getloadavg()
    path = write_result(args.out, record)
    print(f"written: {path}")
    for side in SIDES:
        ends = [r[side]["all_runs_ended_s"] for r in record["rounds"]]
        print(f"{side:7s} all runs ended after {ends} s")


if __name__ == "__main__":
    main()
