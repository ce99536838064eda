"""``hpc-train-report RUN_DIR --profile``: what the torch.profiler traces of a run (``trainer.profile``) say, per
profiled rank: the top operators by self time, where the profiled steps' time went, and which rank is the slowest.
Read with json and gzip only (no torch on the login node); names and annotations: hpc_train.records.profile_traces.

Self time of an event: its duration minus the durations of the events directly nested in it on the same thread
(pid, tid); the events of that tree are the host's ``cpu_op`` and ``user_annotation`` ones (the Python frames that
``with_stack`` records are left out). A GPU kernel (memcpy, memset) nests nothing: its self time is its duration.
The operators (``cpu_op``; GPU kernels apart) of the profiled steps are ranked by self time, which matches torch's
own table (key_averages); a share is of the summed self time of all of them (torch's also sums annotations).

Step time: the span of the ``hpc_train.step#N`` annotations over their count. It is split into parts that never
overlap and add up to it: each instant counts once, in the first part that holds it, in this order:

- CPU trace: **data**: the main thread is in a ``hpc_train.data`` annotation; **checkpoint**: in
  ``hpc_train.checkpoint``; **compute**: a thread of the rank is in a ``cpu_op`` that is no collective (nor in
  one); **communication**: a collective is in flight: a collective ``cpu_op`` (``c10d::*``, ``gloo:*``, ``nccl:*``,
  ``record_param_comms``) or gloo's own ``gloo:*`` annotation on its worker thread, which spans the collective from
  start to end, the wait for the slowest rank included (the main thread's ``c10d::allreduce_`` only hands the work
  over; DDP then waits for it inside the autograd engine, in no op); **idle**: the rest (Python between ops).
- GPU trace (it holds ``kernel`` events): **compute**: the GPU runs a kernel, memcpy or memset that is not NCCL's;
  **communication**: an NCCL kernel (name holding "nccl") runs, i.e. communication compute does not hide, the wait
  for a slow rank included; **data**, **checkpoint**: the host is in that annotation while the GPU runs nothing;
  **idle**: the rest. The host queues work ahead of the GPU, so the span runs on past the last step's annotation
  until the GPU's last kernel ends (the profiler waits for the GPU when it stops: all its kernels are the steps').

In a synchronous data-parallel job every rank's step takes the same wall time: the fast ranks wait in the
collectives. The slowest rank is the one with the most work per step (compute + data), compared with the median
of the other ranks' traces of the same steps.
"""

from __future__ import annotations

import gzip
import json
import statistics
import sys
import zlib
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from hpc_train.errors import HpcTrainError, RunDirRefused
from hpc_train.jobs.text_table import format_table
from hpc_train.records.profile_traces import PHASES, STEP_PREFIX, list_traces, profile_dir, step_number, trace_of

TOP = 10  # operators listed per rank
NAME_WIDTH = 90  # a kernel's templated name is cut to this in the text (--json has it whole)
COLLECTIVES = ("c10d::", "gloo:", "nccl:", "record_param_comms")
HOST = ("cpu_op", "user_annotation")
GPU_BUSY = ("kernel", "gpu_memcpy", "gpu_memset")
PARTS = ("compute", "communication", "data", "checkpoint", "idle")
HOW_TO = "trainer.profile.steps=[10,12] (and trainer.profile.ranks=all to compare the ranks)"
Spans = List[Tuple[float, float]]


class TraceError(HpcTrainError):
    """A trace that cannot be read or holds no profiled step: one line saying so."""


class NoTraces(RunDirRefused):
    """A run dir with no profiler trace to report (or no run dir at all): one line saying so and how to take one."""


@dataclass
class Trace:
    path: Path
    events: List[Dict[str, Any]]  # the complete ("ph": "X") events, ts and dur in microseconds
    world_size: Optional[int] = None  # the run's, where the trace says (distributedInfo)


@dataclass
class Summary:
    run_dir: Path
    ranks: List[Dict[str, Any]] = field(default_factory=list)
    comparisons: List[Dict[str, Any]] = field(default_factory=list)
    problems: List[str] = field(default_factory=list)


def read_trace(path: Path) -> Trace:
    try:
        with gzip.open(path, "rt", encoding="utf-8") as stream:
            data = json.load(stream)
    except (OSError, EOFError, ValueError, zlib.error) as err:
        raise TraceError(f"{path}: unreadable trace ({err}): did the rank stop while writing it?") from None
    raw = data.get("traceEvents") if isinstance(data, dict) else None
    if not isinstance(raw, list):
        raise TraceError(f"{path}: not a Chrome trace (no traceEvents list)")
    events = [e for e in raw if _complete(e)]
    about = data.get("distributedInfo")
    world = about.get("world_size") if isinstance(about, dict) else None
    return Trace(Path(path), events, world if isinstance(world, int) else None)


def _complete(e: Any) -> bool:
    """A complete event ("ph": "X") with a name, a start and a duration."""
    timed = isinstance(e, dict) and all(isinstance(e.get(key), (int, float)) for key in ("ts", "dur"))
    return timed and e.get("ph") == "X" and isinstance(e.get("name"), str)


# -- spans: sorted, disjoint (start, end) lists -----------------------------------------------
def _union(spans: Spans) -> Spans:
    merged: Spans = []
    for lo, hi in sorted(spans):
        if merged and lo <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], hi))
        elif hi > lo:
            merged.append((lo, hi))
    return merged


def _meet(a: Spans, b: Spans) -> Spans:
    out, i, j = [], 0, 0
    while i < len(a) and j < len(b):
        lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if lo < hi:
            out.append((lo, hi))
        i, j = (i + 1, j) if a[i][1] < b[j][1] else (i, j + 1)
    return out


def _minus(a: Spans, *others: Spans) -> Spans:
    b = _union([span for spans in others for span in spans])
    out, j = [], 0
    for lo, hi in a:
        while j < len(b) and b[j][1] <= lo:
            j += 1
        start, k = lo, j
        while k < len(b) and b[k][0] < hi:
            if b[k][0] > start:
                out.append((start, b[k][0]))
            start, k = max(start, b[k][1]), k + 1
        if start < hi:
            out.append((start, hi))
    return out


def _length(spans: Spans) -> float:
    return sum(hi - lo for lo, hi in spans)


def _spans(events: List[Dict[str, Any]]) -> Spans:
    return _union([(e["ts"], e["ts"] + e["dur"]) for e in events])


def _inside(ts: float, window: Spans) -> bool:
    return any(lo <= ts < hi for lo, hi in window)


def _collective(event: Dict[str, Any]) -> bool:
    return event["name"].startswith(COLLECTIVES)


def _by_thread(events: List[Dict[str, Any]], cats: Tuple[str, ...]) -> List[List[Dict[str, Any]]]:
    threads: Dict[Tuple[Any, Any], List[Dict[str, Any]]] = defaultdict(list)
    for e in events:
        if e.get("cat") in cats:
            threads[(e.get("pid"), e.get("tid"))].append(e)
    return list(threads.values())


# -- one trace ----------------------------------------------------------------------------------
def self_times(events: List[Dict[str, Any]]) -> List[Tuple[Dict[str, Any], float]]:
    """(event, self time in us) of every host event: its duration less that of the events directly nested in it."""
    found = []
    for thread in _by_thread(events, HOST):
        thread.sort(key=lambda e: (e["ts"], -e["dur"]))
        stack: List[List[Any]] = []  # [event, its end, its self time so far]
        for e in thread:
            while stack and e["ts"] >= stack[-1][1]:
                found.append((stack[-1][0], max(0.0, stack.pop()[2])))
            if stack:
                stack[-1][2] -= min(e["ts"] + e["dur"], stack[-1][1]) - e["ts"]
            stack.append([e, e["ts"] + e["dur"], float(e["dur"])])
        found += [(entry[0], max(0.0, entry[2])) for entry in stack]
    return found


def _top(timed: List[Tuple[str, float]], count: int) -> List[Dict[str, Any]]:
    by_name: Dict[str, List[float]] = defaultdict(lambda: [0, 0.0])
    for name, us in timed:
        by_name[name][0] += 1
        by_name[name][1] += us
    total = sum(us for _, us in by_name.values()) or 1.0
    ranked = sorted(by_name.items(), key=lambda item: (-item[1][1], item[0]))[:count]
    return [{"name": n, "calls": int(c), "self_ms": us / 1e3, "share": us / total} for n, (c, us) in ranked]


def summarise_trace(trace: Trace, top: int = TOP) -> Dict[str, Any]:
    rank, first, last = trace_of(trace.path) or (-1, 0, 0)
    events = trace.events
    marks = [e for e in events if e.get("cat") == "user_annotation"]  # the host's (a GPU trace repeats them)
    steps = [e for e in marks if step_number(str(e.get("name"))) is not None]
    if not steps:
        raise TraceError(f"{trace.path}: no {STEP_PREFIX}N annotation in it: not a trace of hpc_train's steps")
    window = _spans(steps)
    host = {name: _spans([e for e in marks if e.get("name") == mark]) for name, mark in PHASES.items()}
    busy = [e for e in events if e.get("cat") in GPU_BUSY]
    gpu = any(e.get("cat") == "kernel" for e in busy)
    if gpu:  # the GPU finishing the work the last step queued
        window = _union([*window, (window[-1][1], max(e["ts"] + e["dur"] for e in busy))])
        compute = _meet(_spans([e for e in busy if "nccl" not in e["name"].lower()]), window)
        comm = _minus(_meet(_spans([e for e in busy if "nccl" in e["name"].lower()]), window), compute)
        data = _minus(_meet(host["data"], window), compute, comm)
        checkpoint = _minus(_meet(host["checkpoint"], window), compute, comm, data)
    else:
        data = _meet(host["data"], window)
        checkpoint = _minus(_meet(host["checkpoint"], window), data)
        working = [  # per thread: inside an op, not inside a collective
            _minus(_spans([e for e in own if not _collective(e)]), _spans([e for e in own if _collective(e)]))
            for own in _by_thread(events, ("cpu_op",))
        ]
        collectives = [e for e in events if e.get("cat") in HOST and _collective(e)]
        compute = _minus(_meet(_union([span for spans in working for span in spans]), window), data, checkpoint)
        comm = _minus(_meet(_spans(collectives), window), data, checkpoint, compute)
    count, total = len({step_number(e["name"]) for e in steps}), _length(window)
    parts = {"compute": compute, "communication": comm, "data": data, "checkpoint": checkpoint}
    ms = {name: _length(spans) / 1e3 / count for name, spans in parts.items()}
    ms["idle"] = max(0.0, total / 1e3 / count - sum(ms.values()))
    step_ms = sum(ms.values())
    operators = [(e["name"], us) for e, us in self_times(events) if e["cat"] == "cpu_op" and _inside(e["ts"], window)]
    kernels = [(e["name"], float(e["dur"])) for e in busy if _inside(e["ts"], window)]
    return {
        "rank": rank,
        "steps": [first, last],
        "path": str(trace.path),
        "device": "gpu" if gpu else "cpu",
        "steps_profiled": count,
        "world_size": trace.world_size,
        "step_ms": step_ms,
        "ms_per_step": ms,
        "shares": {name: value / step_ms if step_ms else 0.0 for name, value in ms.items()},
        "work_ms": ms["compute"] + ms["data"],
        "top_operators": _top(operators, top),
        "top_kernels": _top(kernels, top) if gpu else [],
    }


# -- the run ------------------------------------------------------------------------------------
def compare(ranks: List[Dict[str, Any]]) -> Dict[str, Any]:
    """The slowest of the ranks profiled over the same steps (or why none is named)."""
    steps = ranks[0]["steps"]
    if len(ranks) == 1:
        note = f"only rank {ranks[0]['rank']}'s trace of these steps: naming the slowest rank needs several ranks'"
        note += " (trainer.profile.ranks=all)" if ranks[0]["world_size"] != 1 else " (this run has one)"
        return {"steps": steps, "slowest": None, "note": note}
    slowest = max(ranks, key=lambda r: r["work_ms"])
    median = statistics.median(r["work_ms"] for r in ranks if r is not slowest)
    return {"steps": steps, "slowest": slowest["rank"], "work_ms": slowest["work_ms"], "median_ms": median}


def summarise(run_dir: Path, top: int = TOP) -> Summary:
    paths = list_traces(run_dir)
    if not Path(run_dir).is_dir():
        raise NoTraces(f"hpc-train-report: {run_dir} is not a folder: give a run dir (outputs/DATE/TIME)")
    if not paths:
        raise NoTraces(f"hpc-train-report: no profiler trace in {profile_dir(run_dir)}: take one with {HOW_TO}")
    found = Summary(Path(run_dir))
    for path in paths:
        try:
            found.ranks.append(summarise_trace(read_trace(path), top))
        except TraceError as err:
            found.problems.append(str(err))
    groups: Dict[Tuple[int, int], List[Dict[str, Any]]] = defaultdict(list)
    for rank in found.ranks:
        groups[tuple(rank["steps"])].append(rank)
    found.comparisons = [compare(ranks) for _, ranks in sorted(groups.items())]
    return found


def _table(rows: List[Dict[str, Any]], what: str) -> str:
    cells = [
        [r["name"] if len(r["name"]) <= NAME_WIDTH else r["name"][: NAME_WIDTH - 3] + "...", r["calls"]]
        + [f"{r['self_ms']:.3f}", f"{100 * r['share']:.1f}%"]
        for r in rows
    ]
    return format_table([what, "calls", "self ms", "share"], cells, right={"calls", "self ms", "share"})


def _indented(text: str) -> List[str]:
    return ["  " + line for line in text.splitlines()]


def render_summary(found: Summary) -> str:
    lines = [f"hpc-train-report: {found.run_dir} (profile)"]
    for r in found.ranks:
        first, last = r["steps"]
        device = "GPU timeline" if r["device"] == "gpu" else "CPU"
        head = f"rank {r['rank']}, steps {first}-{last} ({r['steps_profiled']} profiled, {device})"
        lines += ["", f"{head}: {r['step_ms']:.1f} ms per step"]
        shown = [name for name in PARTS if name != "checkpoint" or r["ms_per_step"][name] > 0]
        cells = [[name, f"{r['ms_per_step'][name]:.2f}", f"{100 * r['shares'][name]:.1f}%"] for name in shown]
        lines += _indented(format_table(["part", "ms/step", "share"], cells, right={"ms/step", "share"}))
        lines += _indented(_table(r["top_operators"], "operator (self time)"))
        if r["top_kernels"]:
            lines += _indented(_table(r["top_kernels"], "GPU kernel"))
    lines.append("")
    for c in found.comparisons:
        if c["slowest"] is None:
            lines.append(f"steps {c['steps'][0]}-{c['steps'][1]}: {c['note']}")
        else:
            lines.append(
                f"slowest rank: {c['slowest']} ({c['work_ms']:.1f} ms of work per step against a median of"
                f" {c['median_ms']:.1f} ms; the others wait for it in communication)"
            )
    lines += [f"hpc-train-report: {problem}" for problem in found.problems]
    return "\n".join(lines)


def render(run_dir: Path) -> str:
    """The text ``--profile`` prints; raises NoTraces when the run dir holds no trace."""
    return render_summary(summarise(run_dir))


def main(run_dir: Path, as_json: bool = False, remote: bool = False) -> int:
    """``--profile``: 0, or 2 (no trace, or one unreadable); ``remote``: a laptop's copy of a cluster's run dir."""
    try:
        found = summarise(run_dir)
    except NoTraces as err:
        fetch = " (a cluster's run: its traces come here with --fetch)" if remote else ""
        print(f"{err}{fetch}", file=sys.stderr)
        return 2
    if as_json:
        print(json.dumps({**asdict(found), "run_dir": str(found.run_dir)}, indent=2))
        for problem in found.problems:
            print(f"hpc-train-report: {problem}", file=sys.stderr)
    else:
        print(render_summary(found))
    return 2 if found.problems else 0
