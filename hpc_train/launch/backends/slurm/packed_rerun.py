"""``--rerun-failed`` for a packed sweep: its FAILED and CANCELLED runs packed again, into one new allocation.

Each run goes again as its allocation's plan describes it (hpc_train.pack.records.PackedRun: run dir, layout, its
step's command and environment), into one allocation of the same shape (nodes, GPUs, CPUs, time, signal) submitted
as hpc_train.launch.backends.slurm.packed submits any: plan written, script rendered, sbatch. Its sbatch parameters are
the ones the plan of the allocation that had the first of those runs records (AllocationPlan.sbatch, the data its
script was rendered from), but for the job name's index; the batch script itself is never read back. A plan
written before plans recorded them (an older hpc-train's) is refused, with the fix in words, rather than guessed
from its script. The new plan takes the next index: from now on the newest allocation that lists a run says its
state (records.run_states), and each run resumes in its own run dir (an hpc-train run from its checkpoint).
``jobs.tsv`` gets a row per run with its new packed id, ``submissions.jsonl`` a line (``rerun_of``: the old id).
No torch here.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Tuple

from hpc_train.config.errors import ConfigError
from hpc_train.jobs import job_table
from hpc_train.jobs.submissions import record
from hpc_train.pack import app_step, records, status
from hpc_train.pack.records import AllocationPlan, PackedRun
from hpc_train.records import rundir

RERUN = (records.FAILED, records.CANCELLED)  # a run in any other state has completed, or may still


def failed_runs(runs: Mapping[str, records.RunState], numbers: List[str]) -> List[str]:
    """Which of these run numbers to rerun (their newest allocation's records say FAILED or CANCELLED), in order."""
    wanted = [n for n in numbers if n in runs and runs[n].state in RERUN]
    return sorted(wanted, key=lambda n: (0, int(n)) if n.isdigit() else (1, n))


def rerun_plan(plans: List[AllocationPlan], numbers: List[str], index: int) -> Tuple[AllocationPlan, AllocationPlan]:
    """(the new allocation's plan, the plan whose shape and script it takes): the runs as their newest plan lists
    them, in one allocation shaped as the first run's."""
    newest: Dict[str, Tuple[AllocationPlan, PackedRun]] = {}
    for plan in sorted(plans, key=lambda p: p.index):
        for run in plan.runs:
            newest[run.job] = (plan, run)
    source = newest[numbers[0]][0]
    max_requeues = max(newest[n][0].max_requeues for n in numbers)
    runs = [newest[n][1] for n in numbers]
    plan = records.new_plan(index, source, source.signal, source.signal_delay_s, max_requeues, runs)
    return plan, source


def rerun_params(source: AllocationPlan, new_index: int) -> Optional[Dict[str, Any]]:
    """The sbatch parameters `source`'s plan records, its job name for `new_index`; None when its plan does not
    record them (written by an hpc-train from before plans did)."""
    if source.sbatch is None:
        return None
    params = copy.deepcopy(source.sbatch)
    name = str(params.get("job_name", ""))
    if name.endswith(f"-pack{source.index}"):
        params["job_name"] = name[: -len(str(source.index))] + str(new_index)
    return params


def rerun_packed(sweep_dir: Path, rows: Mapping[str, job_table.JobRow]) -> Tuple[int, Optional[str]]:
    """Pack the failed runs among `rows` (run number -> its newest jobs.tsv row, a packed id) into one new
    allocation; (how many, a refusal in words or None)."""
    # launch.pack loads the launcher's Slurm side (~0.1 s): hpc-train-report and the API import this module too
    from hpc_train.launch.backends.slurm import packed as pack

    sweep_dir = Path(sweep_dir).absolute()  # the batch script names its plan and logs wherever sbatch runs it
    now = status.read(sweep_dir)  # the runs' states and the plans they were read from: read once
    numbers = failed_runs(now.runs, list(rows))
    if not numbers:
        return 0, None
    plan, source = rerun_plan(now.plans, numbers, records.next_index(now.plans))
    params = rerun_params(source, plan.index)
    if params is None:
        return 0, (
            f"allocation {source.index}'s plan ({records.plan_path(sweep_dir, source.index)}) does not record its"
            " sbatch parameters (an older hpc-train wrote it), so its runs cannot be packed again as they were;"
            " rerun them with the hpc-train version that submitted this sweep, or by hand with their overrides"
            f" (runs {', '.join(numbers)} in {sweep_dir / rundir.JOB_TABLE})"
        )
    for run in plan.runs:  # a Hydra app's run: its earlier attempt's JobReturn is not this one's
        (Path(run.run_dir) / app_step.RETURN_FILE).unlink(missing_ok=True)
    try:
        (submitted,) = pack.submit([(plan, params)], sweep_dir)
    except ConfigError as err:
        return 0, f"the rerun's allocation was refused: {err.message}"
    new_rows, entries = [], []
    for number in numbers:
        old, new = rows[number].job_id, records.packed_id(str(submitted.job_id), number)
        print(f"hpc-train: job #{number} ({rows[number].overrides}): failed as {old}, packed again as {new}")
        new_rows.append(job_table.JobRow(new, number, rows[number].overrides, rows[number].layout))
        entries.append({"job_id": new, "job": number, "allocation": submitted.index, "rerun_of": old})
    print(f"hpc-train: {len(numbers)} run(s) packed into allocation {submitted.index} (Slurm job {submitted.job_id})")
    record(sweep_dir, entries)
    job_table.print_and_append(sweep_dir, new_rows)
    return len(numbers), None
