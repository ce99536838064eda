"""Helpers shared by the benchmark scripts: statistics, subprocess timing, machine info, JSON output.

Nothing here imports torch, so `run.py` and the login-latency benchmark stay light.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Sequence

HERE = Path(__file__).resolve().parent
REPO = HERE.parent


def import_root(tree: Path) -> Path:
    """The directory to put on PYTHONPATH to import a checkout's hpc_train: the checkout itself, or src/ for a
    src-layout one."""
    return tree / "src" if (tree / "src" / "hpc_train").is_dir() else tree


RESULTS = HERE / "results"
SOURCES = ("hpc_train", "conf", "hydra_plugins")  # the product's source folders (a run on a dirty tree says so)
PYTHON = sys.executable


def stats(values: Sequence[float]) -> Dict[str, float]:
    """Median, min and max of repeated measurements (plus the raw values)."""
    values = [float(v) for v in values]
    return {
        "median": statistics.median(values),
        "min": min(values),
        "max": max(values),
        "n": len(values),
        "values": values,
    }


def fmt_stats(s: Optional[Dict[str, float]], digits: int = 2) -> str:
    """`median (min-max)`, or `-` when not measured."""
    if not s:
        return "-"
    return f"{s['median']:.{digits}f} ({s['min']:.{digits}f}-{s['max']:.{digits}f})"


def cpu_env(threads: int) -> Dict[str, str]:
    """Environment for a CPU run: GPUs hidden, `threads` intra-op threads."""
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads), CUDA_VISIBLE_DEVICES="")
    for key in [k for k in env if k.startswith(("SLURM_", "SUBMITIT_"))]:
        del env[key]
    return env


def run_checked(
    cmd: List[str], env: Optional[Dict[str, str]] = None, cwd: Optional[Path] = None, timeout: Optional[float] = None
) -> subprocess.CompletedProcess:
    """Run a command, capture its output, and fail with the tail of that output if it fails.

    For an hpc-train run (a `hydra.run.dir=` argument) the tails of its per-rank logs are added.
    """
    proc = subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        tail = (proc.stdout[-2000:] + "\n" + proc.stderr[-4000:]).strip()
        for arg in cmd:
            if str(arg).startswith("hydra.run.dir="):
                for log in sorted(Path(str(arg).split("=", 1)[1]).glob("logs/rank*.log")):
                    tail += f"\n--- {log.name} (tail) ---\n" + log.read_text(errors="replace")[-1500:]
        raise RuntimeError(f"command failed ({proc.returncode}): {' '.join(cmd)}\n{tail}")
    return proc


def hpc_train_cmd(overrides: Iterable[str]) -> List[str]:
    """`hpc-train ...` through the current interpreter (same as the console script)."""
    return [PYTHON, "-m", "hpc_train.cli", *overrides]


def read_json(path: Path) -> dict:
    return json.loads(Path(path).read_text())


def _version(dist: str) -> Optional[str]:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def git_commit(tree: Path = REPO, mark_dirty: bool = True) -> Optional[str]:
    """Short commit of a checkout, `+dirty` when its sources differ from it (if mark_dirty)."""
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=tree, capture_output=True, text=True, timeout=10
        )
        if out.returncode != 0:
            return None
        if not mark_dirty:
            return out.stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--", *SOURCES], cwd=tree, capture_output=True, text=True, timeout=10
        )
        return out.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.TimeoutExpired):
        return None


def load() -> List[float]:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return []


def cpu_busy(seconds: float = 1.0) -> Optional[float]:
    """Fraction of all CPUs busy (not idle/iowait) over `seconds`, from /proc/stat: 0.0 on a quiet machine.

    Counts every process of the machine, also those in other containers that `ps` cannot see.
    """

    def sample():
        fields = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
        idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
        return sum(fields), idle

    try:
        total0, idle0 = sample()
        time.sleep(seconds)
        total1, idle1 = sample()
    except (OSError, ValueError, IndexError):
        return None
    total = total1 - total0
    return round(1.0 - (idle1 - idle0) / total, 3) if total > 0 else None


def machine_info(busy_seconds: float = 0.0) -> dict:
    """What the numbers depend on: host, CPU, versions, load average (and, if asked, CPU busy fraction) now."""
    info = {"cpu_busy_before": cpu_busy(busy_seconds)} if busy_seconds else {}
    return info | {
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "host": platform.node(),
        "cpu": _cpu_model(),
        "cpus": os.cpu_count(),
        "load_avg_1_5_15": load(),
        "python": platform.python_version(),
        "torch": _version("torch"),
        "torchvision": _version("torchvision"),
        "hydra-core": _version("hydra-core"),
        "submitit": _version("submitit"),
        "hydra-submitit-launcher": _version("hydra-submitit-launcher"),
        "hpc_train_commit": git_commit(),
    }


def write_result(name: str, record: dict) -> Path:
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps(record, indent=2, default=str) + "\n")
    return path


def row(
    benchmark: str,
    measured: str,
    value: Optional[dict],
    reference: str,
    ref_value: Optional[dict],
    figure: str,
    unit: str,
    target: str = "",
    note: str = "",
) -> dict:
    """One line of run.py's table: a measurement next to its reference in the same run."""
    return {
        "benchmark": benchmark,
        "measured": measured,
        "value": value,
        "reference": reference,
        "ref_value": ref_value,
        "figure": figure,
        "unit": unit,
        "target": target,
        "note": note,
    }


def paired_ratios(a: Sequence[float], b: Sequence[float]) -> List[float]:
    """a[i] / b[i] for runs made back to back (alternating), so slow drifts of the machine cancel."""
    return [x / y for x, y in zip(a, b)]


# -- the per-step probe (benchmarks/stepprobe/) ----------------------------------------------
STEPPROBE = HERE / "stepprobe"  # first on PYTHONPATH, with HPC_BENCH_STEPPROBE_DIR set: every step of a run is timed


def probe_record(probe_dir: Path) -> dict:
    """The step probe's record of the one training process of a run (it wrote it to probe_dir at exit)."""
    files = list(Path(probe_dir).glob("steps-*.json"))
    if len(files) != 1:
        raise RuntimeError(f"expected one probed training process, found {len(files)} in {probe_dir}")
    return json.loads(files[0].read_text())


# -- runs that other processes did not share --------------------------------------------
FOREIGN_MAX = 0.10  # cores: a run during which other processes used more is repeated
CLEAN_ATTEMPTS = 4


def _busy_seconds() -> float:
    fields = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")  # user..steal, without guest (counted in user)


def foreign_cpu(fn):
    """Run fn(); return (its result, cores used meanwhile by processes other than this one and its children).

    Machine-wide busy time from /proc/stat (every process of the machine, also other containers')
    minus this process's and its waited-for children's CPU time (os.times), over the wall time.
    The benchmarked commands are children that are waited for, so they count as ours.
    """
    try:
        busy0, mine0, wall0 = _busy_seconds(), os.times(), time.perf_counter()
    except (OSError, ValueError, IndexError):
        return fn(), None
    value = fn()
    busy1, mine1, wall1 = _busy_seconds(), os.times(), time.perf_counter()
    ours = sum(mine1[:4]) - sum(mine0[:4])
    return value, round(max(0.0, (busy1 - busy0) - ours) / max(1e-9, wall1 - wall0), 3)


def wait_for_quiet(max_load: float = 1.0, timeout_s: float = 300.0) -> List[float]:
    """Wait (at most timeout_s) until the 1-minute load average is below max_load; return the load then."""
    deadline = time.monotonic() + timeout_s
    while load() and load()[0] >= max_load and time.monotonic() < deadline:
        time.sleep(10)
    return load()


def clean_run(fn, max_foreign: float = FOREIGN_MAX, attempts: int = CLEAN_ATTEMPTS, log=None):
    """fn() until no other process used more than `max_foreign` cores during it (at most `attempts` tries).

    Returns (value, record): record holds the foreign CPU of every try and whether the kept one
    was clean. Between tries it waits for the load average to drop (at most 5 minutes).
    """
    tries = []
    for attempt in range(attempts):
        value, foreign = foreign_cpu(fn)
        tries.append(foreign)
        if foreign is None or foreign <= max_foreign:
            return value, {"foreign_cores": tries, "clean": True}
        if log:
            log(
                f"  other processes used {foreign:.2f} cores during this run: discarded, repeating"
                f" (try {attempt + 2} of {attempts})"
            )
        wait_for_quiet()
    return value, {"foreign_cores": tries, "clean": False}


def wait_ranks(procs: List[subprocess.Popen], timeout: float) -> List[str]:
    """Wait for every rank; a failed one is reported and the others killed (they would wait in a collective)."""
    deadline = time.monotonic() + timeout
    failed = []
    for r, proc in enumerate(procs):
        try:
            out, _ = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            out, _ = proc.communicate()
        if proc.returncode != 0:
            failed.append(f"--- rank {r} (exit {proc.returncode}) ---\n{out[-3000:]}")
            for other in procs:
                if other.poll() is None:
                    other.kill()
    return failed
