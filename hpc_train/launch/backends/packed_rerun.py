"""``--rerun-failed`` for a packed sweep: its FAILED and CANCELLED runs packed again, into one new allocation.

Each run goes again as its allocation's plan describes it (hpc_train.pack.records.PackedRun: run dir, layout, its
step's command and environment), into one allocation of the same shape (nodes, GPUs, CPUs, time, signal) submitted
as hpc_train.launch.backends.packed submits any: plan written, script rendered, sbatch. Its sbatch parameters are read back
from the batch script of the allocation that had the first of those runs (pack.render wrote them, so rendering
them again gives the same script, but for the plan's path and the job name's index). The new plan takes the next
index: from now on the newest allocation that lists a run says its state (records.run_states), and each run
resumes in its own run dir (an hpc-train run from its checkpoint). ``jobs.tsv`` gets a row per run with its new
packed id, ``submissions.jsonl`` a line (``rerun_of``: the old id). No torch here.
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Tuple

from hpc_train.config.errors import ConfigError
from hpc_train.jobs import job_table
from hpc_train.jobs.submissions import record
from hpc_train.pack import app_step, records, status
from hpc_train.pack.records import AllocationPlan, PackedRun

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
    plan = AllocationPlan(
        index=index,
        nodes=source.nodes,
        gpus_per_node=source.gpus_per_node,
        cpus_per_node=source.cpus_per_node,
        minutes=source.minutes,
        signal=source.signal,
        signal_delay_s=source.signal_delay_s,
        max_requeues=max(newest[n][0].max_requeues for n in numbers),
        runs=[newest[n][1] for n in numbers],
    )
    return plan, source


# What pack.render writes itself, whatever the parameters: not read back.
_RENDERED = ("output", "error", "open-mode", "open_mode")


def params_of_script(text: str, old_index: int, new_index: int) -> Dict[str, Any]:
    """The sbatch parameters an allocation's script was rendered from (pack.render), its job name for `new_index`."""
    lines = text.splitlines()
    params: Dict[str, Any] = {}
    for line in lines:
        if not line.startswith("#SBATCH --"):
            continue
        flag = line[len("#SBATCH --") :]
        key, has_value, value = flag.partition("=")
        if key in _RENDERED:
            continue
        params[key.replace("-", "_")] = (shlex.split(value) or [""])[0] if has_value else True
    name = str(params.get("job_name", ""))
    if name.endswith(f"-pack{old_index}"):
        params["job_name"] = name[: -len(str(old_index))] + str(new_index)
    if "# setup" in lines:
        start = lines.index("# setup") + 1
        end = max((i for i, line in enumerate(lines) if line.startswith("exec ")), default=len(lines))
        setup = lines[start:end]
        while setup and (not setup[-1].strip() or setup[-1].startswith("# ")):
            setup.pop()  # the blank line and the pool's comment that render puts before its exec line
        params["setup"] = setup
    return params


def rerun_packed(sweep_dir: Path, rows: Mapping[str, job_table.JobRow]) -> Tuple[int, Optional[str]]:
    """Pack the failed runs among `rows` (run number -> its newest jobs.tsv row, a packed id) into one new
    allocation; (how many, a refusal in words or None)."""
    # launch.pack loads the launcher's Slurm side (~0.1 s): hpc-train-report and the API import this module too
    from hpc_train.launch.backends import packed as pack

    sweep_dir = Path(sweep_dir).absolute()  # the batch script names its plan and logs wherever sbatch runs it
    numbers = failed_runs(status.packed_states(sweep_dir), list(rows))
    if not numbers:
        return 0, None
    plan, source = rerun_plan(records.read_plans(sweep_dir), numbers, records.next_index(sweep_dir))
    script = records.folder(sweep_dir) / f"allocation_{source.index}.sh"
    try:
        params = params_of_script(script.read_text(), source.index, plan.index)
    except OSError:
        return 0, f"no batch script {script} to take allocation {source.index}'s sbatch parameters from"
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
