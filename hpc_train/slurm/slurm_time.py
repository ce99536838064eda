"""Slurm's duration strings, read once for both sides (no torch).

Slurm writes and accepts ``MM``, ``MM:SS``, ``HH:MM:SS``, ``D-HH``, ``D-HH:MM`` and
``D-HH:MM:SS`` (``--time``, ``sinfo``'s limits, ``squeue``'s time left); ``UNLIMITED``,
``infinite``, ``INVALID`` and ``NOT_SET`` mean no limit.
"""

from __future__ import annotations

import re
from typing import Optional

_DURATION = re.compile(r"^(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?$")


def slurm_seconds(text: object) -> Optional[int]:
    """Seconds of a Slurm duration; None when it is no limit; ValueError when it is not a duration."""
    value = str(text).strip()
    if not value or not value[0].isdigit():
        if value.upper() in ("", "UNLIMITED", "INFINITE", "INVALID", "NOT_SET", "NONE"):
            return None
        raise ValueError(f"{text!r} is not a Slurm duration")
    match = _DURATION.match(value)
    if not match:
        raise ValueError(f"{text!r} is not a Slurm duration")
    days, a, b, c = (int(g) if g else None for g in match.groups())
    if days is not None:  # D-HH, D-HH:MM, D-HH:MM:SS
        return days * 86400 + a * 3600 + (b or 0) * 60 + (c or 0)
    if b is None:  # MM
        return a * 60
    if c is None:  # MM:SS
        return a * 60 + b
    return a * 3600 + b * 60 + c  # HH:MM:SS


def slurm_minutes(text: object) -> Optional[int]:
    """Whole minutes (rounded up) of a Slurm duration; None when it is no limit."""
    seconds = slurm_seconds(text)
    return None if seconds is None else -(-seconds // 60)


def limit_minutes(value: object) -> int:
    """A job's time limit (whole minutes, or a Slurm duration) -> positive whole minutes, rounded up.

    ValueError when it is not a duration or not positive (no limit is not a limit a job may ask for).
    """
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not a Slurm time")
    minutes = value if isinstance(value, int) else slurm_minutes(value)
    if minutes is None or minutes <= 0:
        raise ValueError(f"{value!r} is not a positive time limit")
    return minutes
