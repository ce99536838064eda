"""What a run made of replica groups (``fault_tolerance.replica_groups``) writes about its groups: both sides.

Every failure of a group, its restart, its drop from the quorum and its return is a row of ``metrics.jsonl``::

    {"kind": "replica", "event": "failed", "group": 2, "step": 356, "s": 1732851234.5, "groups": 3,
     "who": "rank 5", "cause": "SIGKILL", "waited_s": 5.3}
    {"kind": "replica", "event": "restarted" | "dropped" | "rejoined", "group": 2, "step": 356, "s": ..., "groups": 3}

``step`` is the step the others were taking when they learned of it (failed, restarted), the first optimizer step the
group missed (dropped) or took part in again (rejoined, also after a restart that was quick enough for no step to
miss it); ``s`` the wall clock (seconds since the epoch); ``groups`` how many groups took that step; ``waited_s``
how long the surviving groups stood waiting for the quorum of that step. The failures and restarts are seen by the
group's launcher (the local launcher, a Slurm job's batch-host agent), which appends them to the attempt's
``events.jsonl`` (:func:`append_event`); the leading group turns them into rows. The summary carries the counts
(failures, restarts, drops, rejoins, steps with fewer groups, seconds waited) and each failure's words, which the
closing line says; ``hpc-train-report`` reads the rows.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict, Iterable, List, Mapping

from hpc_train.records.metrics_log import LAUNCH_ID_VARIABLE

KIND = "replica"
DROPPED, REJOINED = "dropped", "rejoined"
FAILED, RESTARTED = "failed", "restarted"  # seen by the group's launcher (events.jsonl)
ORDER = (FAILED, DROPPED, RESTARTED, REJOINED)  # the events of one step, in the order they happen
FEWER_STEPS = "steps_with_fewer_groups"  # summary.json: optimizer steps taken by fewer groups than the job has
GROUPS = "replica_groups"  # summary.json: R
DROPS, REJOINS = "replica_drops", "replica_rejoins"  # summary.json: how many of each event
FAILURES, RESTARTS = "replica_failures", "replica_restarts"  # summary.json: the groups' failures and restarts
WAITED = "replica_wait_s"  # summary.json: seconds the surviving groups waited for a quorum after failures
HISTORY = "replica_failed"  # summary.json: each failure: {"group", "step", "who", "cause", "rejoined"}


def event_row(event: str, group: int, step: int, seconds: float, live: int, **words: Any) -> Dict[str, Any]:
    row = {"kind": KIND, "event": event, "group": int(group), "step": int(step), "s": float(seconds), "groups": live}
    return {**row, **{key: value for key, value in words.items() if value is not None}}


def changes(before: Iterable[int], after: Iterable[int]) -> List[tuple]:
    """(event, group) for every group that left or joined between two steps' memberships, dropped ones first."""
    old, new = set(before), set(after)
    return [(DROPPED, g) for g in sorted(old - new)] + [(REJOINED, g) for g in sorted(new - old)]


def event_log_line(event: str, group: int, step: int, live: int, total: int, **words: Any) -> str:
    if event == DROPPED:
        return f"replica group {group} dropped at step {step}: {live} of {total} groups train on"
    if event == FAILED:
        said = failure_words(words)
        return f"replica group {group} failed ({said}) during step {step}; {live} of {total} groups took it"
    if event == RESTARTED:
        return f"replica group {group} restarted by its launcher (restart {words.get('restart')})"
    return f"replica group {group} rejoined at step {step}: {live} of {total} groups train"


def failure_words(event: Mapping[str, Any]) -> str:
    """ "rank 5, SIGKILL": who failed and how, as the launcher named it."""
    return ", ".join(str(event[key]) for key in ("who", "cause") if event.get(key))


# -- the launcher's side: the attempt's events.jsonl ----------------------------------------------------------------
EVENTS = "events.jsonl"  # in the attempt's folder: the failures and restarts its launcher saw, one JSON per line


def append_event(folder: Path, event: str, group: int, seconds: float, **words: Any) -> None:
    """The launcher of the groups records a failure (`who`, `cause`) or a restart (`restart`, `where`) of a group.
    One short line per write in append mode: the leading group's rank 0 reads whole lines only."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    row = {"event": event, "group": int(group), "s": float(seconds), **words}
    with open(folder / EVENTS, "a") as handle:
        handle.write(json.dumps(row) + "\n")


def read_events(folder: Path) -> List[Dict[str, Any]]:
    """The launcher's events of this attempt so far, whole lines only (a line being written is left for later)."""
    try:
        text = (Path(folder) / EVENTS).read_text()
    except OSError:
        return []
    found = []
    for line in text.split("\n")[:-1]:  # the part after the last newline is not a whole line yet
        try:
            found.append(json.loads(line))
        except json.JSONDecodeError:
            found.append({})  # counted, so that every group numbers the lines alike
    return found


# -- the closing line and the report ----------------------------------------------------------------------------------
def summary_note(summary: Mapping[str, Any]) -> str:
    """The closing line's words on the groups ("" without replica groups), from the summary's counts, e.g. "; 3
    replica groups: group 2 failed once (rank 5, SIGKILL) and rejoined at step 357; the others waited 6.0 s"."""
    if GROUPS not in summary:
        return ""
    fewer, drops, rejoins = (int(summary.get(key) or 0) for key in (FEWER_STEPS, DROPS, REJOINS))
    history = [entry for entry in summary.get(HISTORY) or [] if isinstance(entry, Mapping)]
    if not drops and not fewer and not history:
        return f"; {summary[GROUPS]} replica groups, none dropped"
    if not history:  # dropped without a failure its launcher saw (a group cut off from the lighthouse)
        said = f"{drops} drop(s), {rejoins} rejoin(s), {fewer} step(s) with fewer groups"
        return f"; {summary[GROUPS]} replica groups: {said}"
    parts = _failures_words(history) + ([f"{fewer} step(s) with fewer groups"] if fewer else [])
    waited = summary.get(WAITED)
    if isinstance(waited, (int, float)):
        parts.append(f"the others waited {float(waited):.1f} s")
    return f"; {summary[GROUPS]} replica groups: " + "; ".join(parts)


def _failures_words(history: List[Mapping[str, Any]]) -> List[str]:
    """One clause per group that failed: how often, each failure's words, and where it stands now."""
    by_group: Dict[int, List[Mapping[str, Any]]] = {}
    for entry in history:
        by_group.setdefault(int(entry.get("group", 0)), []).append(entry)
    clauses = []
    for group, entries in sorted(by_group.items()):
        times = "once" if len(entries) == 1 else f"{len(entries)} times"
        causes = "; ".join(failure_words(entry) or "cause unknown" for entry in entries[:EVENTS_SHOWN])
        back = entries[-1].get("rejoined")
        end = f"rejoined at step {int(back)}" if back is not None else "did not rejoin"
        clauses.append(f"group {group} failed {times} ({causes}) and {end}")
    return clauses


EVENTS_SHOWN = 10  # events a report line names one by one (the rest are counted)


def report_line(summary: Mapping[str, Any], rows: Iterable[Mapping[str, Any]]) -> str:
    """hpc-train-report's line on a run's groups ("" without replica groups), from its summary and its metrics.jsonl
    rows, e.g. "replica groups: 3; 22 step(s) with fewer groups; the others waited 6.2 s; group 1 failed at step 21
    (rank 3, SIGKILL), dropped at step 21, restarted at step 21, rejoined at step 43". Each group's events in step
    order; a group that did not come back has no rejoin."""
    if GROUPS not in summary:
        return ""
    events = sorted(
        (row for row in rows if row.get("kind") == KIND and row.get("event") in ORDER),
        key=lambda row: (int(row.get("step", 0)), ORDER.index(row["event"])),
    )
    fewer = int(summary.get(FEWER_STEPS) or 0)
    line = f"replica groups: {summary[GROUPS]}"
    if not events and not fewer:
        return f"{line}; none dropped"
    line += f"; {fewer} step(s) with fewer groups"
    waited = summary.get(WAITED)
    if isinstance(waited, (int, float)) and any(row["event"] == FAILED for row in events):
        line += f"; the others waited {float(waited):.1f} s"
    by_group: Dict[int, List[str]] = {}
    for row in events[:EVENTS_SHOWN]:
        said = f"{row['event']} at step {int(row['step'])}"
        if row["event"] == FAILED and failure_words(row):
            said += f" ({failure_words(row)})"
        by_group.setdefault(int(row["group"]), []).append(said)
    parts = [f"group {group} " + ", ".join(words) for group, words in sorted(by_group.items())]
    if len(events) > EVENTS_SHOWN:
        parts.append(f"{len(events) - EVENTS_SHOWN} more event(s) in metrics.jsonl")
    return "; ".join([line, *parts])


FOLDER = "replicas"  # <run dir>/replicas/<attempt>/: the groups of one attempt, ready and finished


def attempt_folder(run_dir: Path, env: Mapping[str, str]) -> Path:
    """Where the groups of this attempt leave their marks: named by the Slurm job and its restart count, or by the
    local launch (every group of an attempt sees the same variables)."""
    job = env.get("SLURM_JOB_ID")
    name = f"slurm-{job}-{env.get('SLURM_RESTART_COUNT', '0')}" if job else f"local-{env.get(LAUNCH_ID_VARIABLE, '0')}"
    return Path(run_dir) / FOLDER / name


def ready_file(folder: Path, group: int) -> Path:
    """Group `group` is connected to the lighthouse: an attempt's first quorum waits for every group's."""
    return Path(folder) / f"ready.group{group}"


def asking_file(folder: Path, group: int, rank: int) -> Path:
    """Rank `rank` of restarted group `group` asks for its first quorum; it holds the group's restart number. Written
    under HPC_TRAIN_HOLD_AT only (a test facility: hpc_train.compute.runtime.faults)."""
    return Path(folder) / f"asking.group{group}.rank{rank}"


def finished_file(folder: Path, group: int) -> Path:
    """Group `group` trained to the end: its launcher does not restart it (srun says 0 after a node failure too)."""
    return Path(folder) / f"finished.group{group}"


LIGHTHOUSE_LOG = "lighthouse.log"  # in the run dir's logs/: the lighthouse's output
