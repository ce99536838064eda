"""--rerun-failed on a packed sweep (hpc_train.launch.backends.slurm.packed_rerun): only the FAILED and CANCELLED runs,
together in
one new allocation of the same shape and sbatch parameters, with the next index; jobs.tsv and submissions.jsonl
extended. sbatch is a stand-in here (launch.pack.submit patched), as is Slurm's word (job_states.slurm_states)."""

import json
import subprocess
from pathlib import Path

import pytest

from hpc_train.jobs import job_states, job_table
from hpc_train.jobs.job_table import JobRow
from hpc_train.jobs.submissions import submissions
from hpc_train.launch.backends.rerun import rerun_failed
from hpc_train.launch.backends.slurm import packed as pack
from hpc_train.launch.backends.slurm import packed_rerun
from hpc_train.pack import records
from hpc_train.pack.records import AllocationPlan, PackedRun, RunState
from hpc_train.slurm import slurm_cli

PARAMS = {
    "job_name": "hpc-train-pack1",
    "nodes": 1,
    "ntasks_per_node": 4,
    "cpus_per_task": 2,
    "time": 30,
    "gres": "gpu:4",
    "partition": "gpu_p2",
    "setup": ["module load cuda", "", "export X='a b'", "# a comment"],
    "additional_parameters": {"signal": "B:USR2@120", "requeue": True, "comment": "two words"},
}


def test_the_rerun_takes_its_sbatch_parameters_from_the_plan_its_job_name_for_the_new_index():
    source = plan(1, "41", [run("0")], sbatch=PARAMS)
    params = packed_rerun.rerun_params(source, 12)
    assert params == {**PARAMS, "job_name": "hpc-train-pack12"}
    params["setup"].append("changed")  # a copy: the source plan's record stays as it was
    assert source.sbatch["setup"] == PARAMS["setup"]
    assert packed_rerun.rerun_params(plan(1, "41", [run("0")]), 12) is None  # an older hpc-train's plan


def run(job: str, gpus: int = 1) -> PackedRun:
    return PackedRun(job, f"/sweep/{job}", f"x={job}", 1, 1, gpus, 1, ["python", "job.py", job], {"A": job})


def plan(index, job_id, runs, max_requeues=3, sbatch=None) -> AllocationPlan:
    return AllocationPlan(index, 1, 4, 8, 30, "USR2", 120, max_requeues, runs, job_id, sbatch)


def test_the_new_plan_takes_each_run_as_its_newest_plan_lists_it_and_the_first_ones_shape():
    plans = [
        plan(0, "41", [run("0"), run("2")]),
        plan(1, "42", [run("1"), run("3")], max_requeues=5),
        plan(2, "50", [run("2", gpus=2)], 1),
    ]
    new, source = packed_rerun.rerun_plan(plans, ["2", "3"], 3)
    assert source.index == 2 and new.index == 3 and new.job_id is None
    assert new.runs == [run("2", gpus=2), run("3")]
    assert (new.nodes, new.gpus_per_node, new.cpus_per_node, new.minutes, new.signal, new.max_requeues) == (
        1,
        4,
        8,
        30,
        "USR2",
        5,
    )


def test_only_failed_and_cancelled_runs_go_again_in_run_order():
    states = {
        n: RunState(s, 0, "41")
        for n, s in {
            "10": "FAILED",
            "2": "CANCELLED",
            "3": "COMPLETED",
            "4": "RUNNING",
            "5": "INTERRUPTED",
            "6": "WAITING",
        }.items()
    }
    assert packed_rerun.failed_runs(states, ["10", "2", "3", "4", "5", "6", "7"]) == ["2", "10"]


def sbatch_answering(job_ids, scripts):
    """slurm_cli.run as sbatch: each script submitted is kept in `scripts`, answered with the next job id."""
    answers = iter(job_ids)

    def run(command, **kwargs):
        assert command[:2] == ["sbatch", "--parsable"], command
        scripts.append(Path(command[2]).read_text())
        return subprocess.CompletedProcess(command, 0, f"{next(answers)}\n", "")

    return run


def failed_sweep(tmp_path, monkeypatch):
    """A packed sweep submitted as pack.submit submits one (sbatch answering 41 and 42): allocation 0 has runs 0 and
    2 (2 failed), allocation 1 runs 1 and 3 (never ran: it ran out of time)."""
    monkeypatch.setattr(slurm_cli, "run", sbatch_answering(["41", "42"], []))
    plans = [
        (plan(k, None, [run(j) for j in jobs]), {**PARAMS, "job_name": f"hpc-train-pack{k}"})
        for k, jobs in ((0, ["0", "2"]), (1, ["1", "3"]))
    ]
    pack.submit(plans, tmp_path)
    with records.events_path(tmp_path, 0).open("w") as handle:
        for line in (
            {"time": 1, "event": "started", "run": "2"},
            {"time": 2, "event": "ended", "run": "2", "state": "FAILED", "exit_code": 1},
            {"time": 1, "event": "started", "run": "0"},
            {"time": 2, "event": "ended", "run": "0", "state": "COMPLETED", "exit_code": 0},
        ):
            handle.write(json.dumps(line) + "\n")
    monkeypatch.setattr(job_states, "slurm_states", lambda ids, run_dirs=None: {"41": "COMPLETED", "42": "TIMEOUT"})
    job_table.append(
        tmp_path,
        [JobRow(f"{a}:{n}", n, f"x={n}", "1x1x1") for a, n in (("41", "0"), ("42", "1"), ("41", "2"), ("42", "3"))],
    )


def test_rerun_failed_packs_a_packed_sweeps_failed_runs_into_one_new_allocation(tmp_path, monkeypatch, capsys):
    failed_sweep(tmp_path, monkeypatch)
    submitted = []

    def submit(plans, sweep_dir):
        submitted.extend(plans)
        for new, _ in plans:
            new.job_id = "60"
        return [new for new, _ in plans]

    monkeypatch.setattr(pack, "submit", submit)
    assert rerun_failed(tmp_path) == (3, None)  # 2 failed; 1 and 3 never ran: allocation 42 ran out of time
    ((new, params),) = submitted
    assert new.index == 2 and [r.job for r in new.runs] == ["1", "2", "3"] and params["job_name"] == "hpc-train-pack2"
    assert {n: r.job_id for n, r in job_table.newest(tmp_path).items()} == {
        "0": "41:0",
        "1": "60:1",
        "2": "60:2",
        "3": "60:3",
    }
    assert submissions(tmp_path)["60:2"] == {"job_id": "60:2", "job": "2", "allocation": 2, "rerun_of": "41:2"}
    assert "failed as 41:2, packed again as 60:2" in capsys.readouterr().out


def test_the_rerun_gets_the_same_sbatch_parameters_however_the_scripts_spell_them(tmp_path, monkeypatch):
    """The parameters come from the plan's record, not from the #SBATCH lines: with the lines rendered in another
    wording (and the old scripts gone), the rerun's allocation is asked for exactly what the first one was."""
    monkeypatch.setattr(pack, "sbatch_flag", lambda key, value: f"#SBATCH {key.upper()} := {value!r}  # reworded")
    failed_sweep(tmp_path, monkeypatch)
    first = records.read_plan(records.plan_path(tmp_path, 1))
    assert first.sbatch == {**PARAMS, "job_name": "hpc-train-pack1"}
    for script in records.folder(tmp_path).glob("allocation_*.sh"):
        script.unlink()
    scripts = []
    monkeypatch.setattr(slurm_cli, "run", sbatch_answering(["60"], scripts))
    assert rerun_failed(tmp_path) == (3, None)
    new = records.read_plan(records.plan_path(tmp_path, 2))
    assert new.job_id == "60" and new.sbatch == {**PARAMS, "job_name": "hpc-train-pack2"}
    (script,) = scripts
    assert script == pack.render(records.plan_path(tmp_path, 2), new.sbatch, records.folder(tmp_path))
    assert "#SBATCH NODES := 1  # reworded" in script


def test_a_plan_that_does_not_record_its_sbatch_parameters_is_refused_with_the_fix(tmp_path, monkeypatch):
    failed_sweep(tmp_path, monkeypatch)
    for k in (0, 1):  # as an older hpc-train wrote them
        old = records.read_plan(records.plan_path(tmp_path, k))
        old.sbatch = None
        records.write_plan(tmp_path, old)
    monkeypatch.setattr(pack, "submit", lambda plans, sweep_dir: pytest.fail("nothing may be submitted"))
    count, refusal = rerun_failed(tmp_path)
    assert count == 0 and "allocation 1's plan" in refusal and "does not record its sbatch parameters" in refusal
    assert "by hand with their overrides (runs 1, 2, 3 in" in refusal
