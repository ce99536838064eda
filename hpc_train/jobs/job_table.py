"""The sweep's job table, ``<sweep dir>/jobs.tsv``: one row per submitted job; a rerun adds a row to the same job.

Written by every sweep launcher (hpc-train's own, any Hydra app's) and by ``--rerun-failed``; read by the
report, ``--watch``, the rerun and the Python API. Tab-separated (Python's ``csv``), no quoting: a row is
``job_id  job  overrides  layout`` as the header says, the overrides space-separated. No torch here.
"""

from __future__ import annotations

import csv
import io
from dataclasses import astuple, dataclass
from pathlib import Path
from typing import Dict, Iterable, List

from hpc_train.jobs.text_table import format_table
from hpc_train.records import rundir

HEADER = ("job_id", "job", "overrides", "layout")
_DIALECT = dict(delimiter="\t", quoting=csv.QUOTE_NONE, quotechar=None, lineterminator="\n")


@dataclass(frozen=True)
class JobRow:
    job_id: str  # Slurm's job id (array jobs: ARRAY_TASK), or the process id of a local app job
    job: str  # the job's number in the sweep (its folder name)
    overrides: str
    layout: str


def path_of(sweep_dir: Path) -> Path:
    return Path(sweep_dir) / rundir.JOB_TABLE


def append(sweep_dir: Path, rows: Iterable[JobRow]) -> bool:
    """Append rows (the header first when the table is new); True when it was new."""
    path = path_of(sweep_dir)
    new_table = not path.exists()
    text = io.StringIO(newline="")
    writer = csv.writer(text, **_DIALECT)
    if new_table:
        writer.writerow(HEADER)
    writer.writerows(astuple(row) for row in rows)
    with rundir.recording(path, "its earlier rows are kept whole"):
        rundir.append_whole(path, text.getvalue())  # whole rows or none: never half a row
    return new_table


def read(sweep_dir: Path) -> List[JobRow]:
    """Every row, in the order written (a header repeated by a concurrent writer is skipped); [] without a table."""
    try:
        with path_of(sweep_dir).open(newline="") as handle:
            cells = list(csv.reader(handle, **_DIALECT))
    except OSError:
        return []
    return [JobRow(*(row + [""] * 4)[:4]) for row in cells if len(row) >= 2 and tuple(row[:2]) != HEADER[:2]]


def newest(sweep_dir: Path) -> Dict[str, JobRow]:
    """job number -> its newest row (a rerun's row replaces the failed one)."""
    return {row.job: row for row in read(sweep_dir)}


def print_and_append(sweep_dir: Path, rows: List[JobRow]) -> None:
    """Print this batch's jobs and append them to the sweep's job table (a sweeper may send several batches)."""
    print(format_table(HEADER, [astuple(row) for row in rows], rule=False))
    new_table = append(sweep_dir, rows)
    print(f"hpc-train: job table {'saved to' if new_table else 'extended in'} {path_of(sweep_dir)}")
