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

from typing import Any, Dict, Iterable, List, Mapping

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


def summary_fields(rows: Iterable[Mapping[str, Any]], groups: int, fewer_steps: int) -> Dict[str, Any]:
    events = [row for row in rows if row.get("kind") == KIND]
    return {
        GROUPS: groups,
        FEWER_STEPS: int(fewer_steps),
        DROPS: sum(1 for row in events if row.get("event") == DROPPED),
        REJOINS: sum(1 for row in events if row.get("event") == REJOINED),
    }


def summary_note(summary: Mapping[str, Any]) -> str:
    """The closing line's words on the groups ("" without replica groups)."""
    if GROUPS not in summary:
        return ""
    fewer, drops = int(summary.get(FEWER_STEPS, 0)), int(summary.get(DROPS, 0))
    if not drops and not fewer:
        return f"; {summary[GROUPS]} replica groups, none dropped"
    return (
        f"; {summary[GROUPS]} replica groups: {drops} drop(s), {summary.get(REJOINS, 0)} rejoin(s),"
        f" {fewer} step(s) with fewer groups"
    )
