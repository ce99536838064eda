"""--rerun-failed on a packed sweep (hpc_train.launch.backends.packed_rerun): only the FAILED and CANCELLED runs, together in
one new allocation of the same shape and sbatch parameters, with the next index; jobs.tsv and submissions.jsonl
extended. sbatch is a stand-in here (launch.pack.submit patched), as is Slurm's word (job_states.slurm_states)."""

import json

from hpc_train.jobs import job_states, job_table
from hpc_train.jobs.job_table import JobRow
from hpc_train.jobs.submissions import submissions
from hpc_train.launch.backends import packed as pack
from hpc_train.launch.backends import packed_rerun
from hpc_train.launch.backends.rerun import rerun_failed
from hpc_train.pack import records
from hpc_train.pack.records import AllocationPlan, PackedRun, RunState

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


def test_an_allocations_sbatch_parameters_read_back_from_its_script_render_the_same_script(tmp_path):
    old = pack.render(tmp_path / "allocation_1.json", PARAMS, tmp_path)
    params = packed_rerun.params_of_script(old, 1, 12)
    assert params["job_name"] == "hpc-train-pack12" and params["setup"] == PARAMS["setup"][:3]
    assert params["comment"] == "two words" and params["requeue"] is True and params["time"] == "30"
    again = pack.render(tmp_path / "allocation_12.json", params, tmp_path)
    expected = old.replace("allocation_1.json", "allocation_12.json").replace("pack1\n", "pack12\n")
    assert again.replace("# a comment\n", "") == expected.replace("# a comment\n", "")


def run(job: str, gpus: int = 1) -> PackedRun:
    return PackedRun(job, f"/sweep/{job}", f"x={job}", 1, 1, gpus, 1, ["python", "job.py", job], {"A": job})


def plan(index, job_id, runs, max_requeues=3) -> AllocationPlan:
    return AllocationPlan(index, 1, 4, 8, 30, "USR2", 120, max_requeues, runs, job_id)


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


def test_rerun_failed_packs_a_packed_sweeps_failed_runs_into_one_new_allocation(tmp_path, monkeypatch, capsys):
    folder = records.folder(tmp_path)
    folder.mkdir(parents=True)
    for k, job_id, jobs in ((0, "41", ["0", "2"]), (1, "42", ["1", "3"])):
        records.write_plan(tmp_path, plan(k, job_id, [run(j) for j in jobs]))
        (folder / f"allocation_{k}.sh").write_text(
            pack.render(records.plan_path(tmp_path, k), {**PARAMS, "job_name": f"hpc-train-pack{k}"}, folder)
        )
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
