"""What a run made of replica groups (``fault_tolerance.replica_groups``) writes about its groups: both sides.

Every drop and rejoin of a group is a row of ``metrics.jsonl``::

    {"kind": "replica", "event": "dropped" | "rejoined", "group": 1, "step": 21, "s": 1732851234.5,
     "groups": 2}

``step`` is the first optimizer step the group missed (dropped) or took part in again (rejoined); ``s`` the wall
clock (seconds since the epoch) when the leading group saw it; ``groups`` how many groups took that step. The
summary carries how many steps ran with fewer groups than the job has (``steps_with_fewer_groups``) and the drops
and rejoins; ``hpc-train-report`` reads both from here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, Iterable, List, Mapping

from hpc_train.records.metrics_log import LAUNCH_ID_VARIABLE

KIND = "replica"
DROPPED, REJOINED = "dropped", "rejoined"
FEWER_STEPS = "steps_with_fewer_groups"  # summary.json: optimizer steps taken by fewer groups than the job has
GROUPS = "replica_groups"  # summary.json: R
DROPS, REJOINS = "replica_drops", "replica_rejoins"  # summary.json: how many of each event


def event_row(event: str, group: int, step: int, seconds: float, live: int) -> Dict[str, Any]:
    return {"kind": KIND, "event": event, "group": int(group), "step": int(step), "s": float(seconds), "groups": live}


def changes(before: Iterable[int], after: Iterable[int]) -> List[tuple]:
    """(event, group) for every group that left or joined between two steps' memberships, dropped ones first."""
    old, new = set(before), set(after)
    return [(DROPPED, g) for g in sorted(old - new)] + [(REJOINED, g) for g in sorted(new - old)]


def event_log_line(event: str, group: int, step: int, live: int, total: int) -> str:
    if event == DROPPED:
        return f"replica group {group} dropped at step {step}: {live} of {total} groups train on"
    return f"replica group {group} rejoined at step {step}: {live} of {total} groups train"


def summary_note(summary: Mapping[str, Any]) -> str:
    """The closing line's words on the groups ("" without replica groups), from the summary's counts."""
    if GROUPS not in summary:
        return ""
    fewer, drops, rejoins = (int(summary.get(key) or 0) for key in (FEWER_STEPS, DROPS, REJOINS))
    if not drops and not fewer:
        return f"; {summary[GROUPS]} replica groups, none dropped"
    return (
        f"; {summary[GROUPS]} replica groups: {drops} drop(s), {rejoins} rejoin(s), {fewer} step(s) with fewer groups"
    )


EVENTS_SHOWN = 10  # drops and rejoins a report line names one by one (the rest are counted)


def report_line(summary: Mapping[str, Any], rows: Iterable[Mapping[str, Any]]) -> str:
    """hpc-train-report's line on a run's groups ("" without replica groups), from its summary and its metrics.jsonl
    rows, e.g. "replica groups: 3; 22 step(s) with fewer groups; group 1 dropped at step 21, rejoined at step 43".
    Each group's drops and rejoins in step order; a group that did not come back has no rejoin."""
    if GROUPS not in summary:
        return ""
    events = sorted(
        (row for row in rows if row.get("kind") == KIND and row.get("event") in (DROPPED, REJOINED)),
        key=lambda row: (int(row.get("step", 0)), row.get("event") != DROPPED),
    )
    fewer = int(summary.get(FEWER_STEPS) or 0)
    line = f"replica groups: {summary[GROUPS]}"
    if not events and not fewer:
        return f"{line}; none dropped"
    line += f"; {fewer} step(s) with fewer groups"
    by_group: Dict[int, List[str]] = {}
    for row in events[:EVENTS_SHOWN]:
        by_group.setdefault(int(row["group"]), []).append(f"{row['event']} at step {int(row['step'])}")
    parts = [f"group {group} " + ", ".join(words) for group, words in sorted(by_group.items())]
    if len(events) > EVENTS_SHOWN:
        parts.append(f"{len(events) - EVENTS_SHOWN} more drop(s) and rejoin(s) in metrics.jsonl")
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


def finished_file(folder: Path, group: int) -> Path:
    """Group `group` trained to the end: its launcher does not restart it (srun says 0 after a node failure too)."""
    return Path(folder) / f"finished.group{group}"


def plan_line(node: Mapping[str, Any], world: int, nodes: int, slurm: bool) -> str:
    """The launch's words on the groups ("" without them): under the layout line of a dry run or a start."""
    groups = node.get("replica_groups") if node else None
    if not groups:
        return ""
    groups = int(groups)
    size = world // groups
    where = f", {nodes // groups} node(s) each" if slurm and nodes >= groups else ""
    spare = int(node.get("spare_nodes") or 0) if slurm else 0
    held = f"; {spare} spare node(s): the job holds {nodes + spare}" if spare else ""
    return (
        f"{groups} replica groups of {size} rank{'s' if size > 1 else ''}{where}: a group that fails restarts alone"
        f" while the others train on (a silent group is dropped after {float(node.get('timeout_s', 0)):g} s){held}"
    )


LIGHTHOUSE_LOG = "lighthouse.log"  # in the run dir's logs/: the lighthouse's output


def lighthouse_command(python: str, port: int, min_replicas: int, timeout_s: float) -> List[str]:
    """The lighthouse's process (hpc_train.compute.replicas.lighthouse), as both launchers start it."""
    return [
        python,
        "-m",
        "hpc_train.compute.replicas.lighthouse",
        "--port",
        str(port),
        "--min-replicas",
        str(int(min_replicas)),
        "--timeout-s",
        str(float(timeout_s)),
    ]
