"""The sweep's job table, ``<sweep dir>/jobs.tsv``: one row per submitted job (a rerun adds a row to the same job).

Written by every sweep launcher (hpc-train's own, any Hydra app's) and by ``--rerun-failed``.
"""

from __future__ import annotations

from pathlib import Path
from typing import List


def print_table(rows: List[tuple], path: Path) -> None:
    """Print this batch's jobs and append them to the sweep's job table (a sweeper may send several batches)."""
    header = ("job_id", "job", "overrides", "layout")
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    lines = ["  ".join(str(v).ljust(w) for v, w in zip(row, widths)).rstrip() for row in [header, *rows]]
    print("\n".join(lines))
    new_table = not path.exists()
    with path.open("a") as table:
        table.write(
            "".join("\t".join(str(v) for v in row) + "\n" for row in ([header] if new_table else []) + list(rows))
        )
    print(f"hpc-train: job table {'saved to' if new_table else 'extended in'} {path}")
