"""The replica groups' supervisor (hpc_train.batchhost.supervisor), its restart policy run once against both of its
adapters: the local launcher's processes (launch/backends/local/groups.py) and the batch host's srun steps
(batchhost/groups.py). No process starts: each adapter is given a fake of subprocess.Popen (the process boundary),
Slurm's commands are fakes of slurm_cli's, and the supervisor's clock is one the fake processes end by. The real runs
are tests/e2e/test_replica_group*.py and tests/slurm/test_replica_groups_on_slurm.py."""

from __future__ import annotations

import signal
from dataclasses import replace
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import pytest

from hpc_train.batchhost import groups as srun_groups
from hpc_train.batchhost.supervisor import Clock, ReplicaSupervisor
from hpc_train.contracts.job_layout import JobLayout
from hpc_train.contracts.replica_plan import ReplicaPlan, replica_plan
from hpc_train.launch.backends.local.groups import LocalGroupProcesses
from hpc_train.processes.rank_env import REPLICA_GROUP_VARIABLE, REPLICA_RESTART_VARIABLE
from hpc_train.records import replicas, rundir
from hpc_train.slurm import slurm_cli

FINISH = 0  # a script's exit that is the group's finish: rank 0 leaves its finished mark first, as the ranks do
FOREVER = 1e9
JOB_NODES = ["n1", "n2", "n3"]  # two groups of one node, and a spare


class FakeClock:
    def __init__(self) -> None:
        self.t = 0.0

    def sleep(self, seconds: float) -> None:
        self.t += seconds

    def clock(self) -> Clock:
        return Clock(now=lambda: self.t, sleep=self.sleep, wall=lambda: 1.7e9 + self.t)


class FakeProcess:
    """A group's rank (local) or step (srun): ends at `at` seconds after its start with `code`, or when signalled."""

    def __init__(self, clock: FakeClock, at: float, code: int, mark: Optional[Path]) -> None:
        self.clock, self.end, self.code, self.mark = clock, clock.t + at, code, mark
        self.returncode: Optional[int] = None

    def poll(self) -> Optional[int]:
        if self.returncode is None and self.clock.t >= self.end:
            if self.code == FINISH and self.mark is not None:
                self.mark.parent.mkdir(parents=True, exist_ok=True)
                self.mark.touch()
            self.returncode = self.code
        return self.returncode

    def send_signal(self, signum: int) -> None:
        if self.poll() is None:
            self.returncode = -signum

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def wait(self, timeout: Optional[float] = None) -> int:
        return self.poll() if self.poll() is not None else -signal.SIGKILL


class World:
    """The processes' side: each (group, restart) start ends as `script` says, (seconds, exit status); a group not
    named finishes at 3 s. Locally a failure is its last rank's (rank 1), the others run on until stopped. Each
    start notes the events on record before it (the attempt's events.jsonl)."""

    def __init__(self, plan: ReplicaPlan, script: Dict[Tuple[int, int], Tuple[float, int]]) -> None:
        self.plan, self.script, self.clock = plan, script, FakeClock()
        self.started: List[Tuple[int, int, List[str]]] = []  # (group, restart, the events on record then)

    def popen(self, command: List[str], env: Dict[str, str], **_: object) -> FakeProcess:
        group, restart = int(env[REPLICA_GROUP_VARIABLE]), int(env[REPLICA_RESTART_VARIABLE])
        folder = replicas.attempt_folder(Path(self.plan.run_dir), env)  # as the group's ranks find it
        rank, last = int(env.get("RANK", "0")), self.plan.group_size - 1 if "RANK" in env else 0
        at, code = self.script.get((group, restart), (3.0, FINISH))
        if code != FINISH and rank != last:
            at, code = FOREVER, FINISH
        if rank == 0:
            self.started.append((group, restart, [row["event"] for row in replicas.read_events(folder)]))
        return FakeProcess(self.clock, at, code, replicas.finished_file(folder, group) if rank == 0 else None)


def local_adapter(world: World, monkeypatch) -> LocalGroupProcesses:
    return LocalGroupProcesses(
        world.plan, Path(world.plan.run_dir) / "config.yaml", "http://127.0.0.1:1", None, world.popen
    )


def srun_adapter(world: World, monkeypatch, states: Optional[Dict[str, str]] = None) -> srun_groups.SrunGroupSteps:
    """The batch host of job 77 on JOB_NODES; sinfo says `states` (idle where not said), accounting is off."""
    said = states if states is not None else {}
    monkeypatch.setattr(slurm_cli, "show_job", lambda job: {"NodeList": "n[1-3]"})
    monkeypatch.setattr(slurm_cli, "sacct_steps", lambda job, fields: None)
    monkeypatch.setattr(
        slurm_cli, "query", lambda argv: "\n".join(f"{n} {said.get(n, 'idle')}" for n in JOB_NODES) + "\n"
    )
    env = {"SLURM_JOB_ID": "77", "SLURM_JOB_NODELIST": "n[1-3]"}
    srun = ["srun", "--output", "/x/%j_%t_log.out", "python", "-u", "-m", "submitit.core._submit", "/x"]
    return srun_groups.SrunGroupSteps(world.plan, srun, env, "http://host:1", world.popen)


ADAPTERS = {"local": local_adapter, "srun": srun_adapter}


def plan_of(tmp_path: Path, **changes) -> ReplicaPlan:
    (tmp_path / rundir.LOGS).mkdir(parents=True, exist_ok=True)
    plan = ReplicaPlan(
        groups=2,
        group_nodes=1,
        tasks_per_node=2,
        spare_nodes=1,
        min_replicas=1,
        timeout_s=6.0,
        heartbeat_timeout_s=5.0,
        max_restarts=2,
        run_dir=str(tmp_path),
    )
    return replace(plan, **changes)


def supervise(name: str, world: World, monkeypatch, **adapter_words) -> Tuple[int, List[dict]]:
    """The run's exit status and the rows on record, supervised through the adapter `name`."""
    processes = ADAPTERS[name](world, monkeypatch, **adapter_words)
    try:
        code = ReplicaSupervisor(world.plan, processes, processes.folder, world.clock.clock()).run()
    finally:
        for handle in getattr(processes, "files", []):  # the local ranks' output files
            handle.close()
    return code, replicas.read_events(processes.folder)


@pytest.mark.parametrize("name", sorted(ADAPTERS))
def test_a_failed_group_is_on_record_then_restarted_and_the_run_ends_when_every_group_finished(
    name, tmp_path, monkeypatch, capsys
):
    world = World(plan_of(tmp_path), {(1, 0): (1.0, -signal.SIGKILL)})
    code, rows = supervise(name, world, monkeypatch)
    assert code == 0
    assert [(row["event"], row["group"], row["restart"]) for row in rows] == [("failed", 1, 0), ("restarted", 1, 1)]
    failed, restarted = rows
    assert failed["cause"] == "SIGKILL" and failed["s"] <= restarted["s"]
    assert (1, 1, ["failed", "restarted"]) in world.started, "on record before the restarted group's processes start"
    if name == "local":
        assert failed["who"] == "rank 3" and set(restarted) == {"event", "group", "s", "restart"}
    else:
        assert failed["who"] == "n2" and restarted["where"] == "n3"  # the spare
    assert "restarting group 1" in capsys.readouterr().err


@pytest.mark.parametrize("name", sorted(ADAPTERS))
def test_a_group_failing_once_more_than_max_restarts_ends_the_run_with_its_status(name, tmp_path, monkeypatch, capsys):
    script = {(0, 0): (FOREVER, FINISH), **{(1, restart): (1.0, 7) for restart in range(3)}}
    world = World(plan_of(tmp_path, max_restarts=2), script)
    code, rows = supervise(name, world, monkeypatch)
    assert code == 7
    assert [row["event"] for row in rows] == ["failed", "restarted"] * 2
    assert "replica group 1 failed 3 times (fault_tolerance.max_restarts=2)" in capsys.readouterr().err


@pytest.mark.parametrize("name", sorted(ADAPTERS))
@pytest.mark.parametrize("ending", [rundir.EXIT_INTERRUPTED, rundir.EXIT_REFUSED])
def test_an_exit_that_ends_the_run_ends_it_at_once_unrestarted(name, ending, tmp_path, monkeypatch):
    world = World(plan_of(tmp_path), {(0, 0): (1.0, ending), (1, 0): (1.0, ending)})
    if name == "local":  # a stop signal reaches every rank
        world.popen = every_rank_ends(world)
    code, rows = supervise(name, world, monkeypatch)
    assert (code, rows) == (ending, [])


def every_rank_ends(world: World):
    """Locally every rank of a group ends as the script says (a signal reaches them all)."""

    def popen(command: List[str], env: Dict[str, str], **_: object) -> FakeProcess:
        group, restart = int(env[REPLICA_GROUP_VARIABLE]), int(env[REPLICA_RESTART_VARIABLE])
        at, code = world.script.get((group, restart), (3.0, FINISH))
        return FakeProcess(world.clock, at, code, None)

    return popen


@pytest.mark.parametrize("name", sorted(ADAPTERS))
def test_a_hung_group_is_restarted(name, tmp_path, monkeypatch):
    world = World(plan_of(tmp_path), {(0, 0): (1.0, rundir.EXIT_HUNG)})
    code, rows = supervise(name, world, monkeypatch)
    assert code == 0 and [(row["event"], row["group"], row["cause"]) for row in rows[:1]] == [("failed", 0, "hung")]


@pytest.mark.parametrize("name", sorted(ADAPTERS))
def test_once_a_group_finished_the_others_get_timeout_s_and_a_minute(name, tmp_path, monkeypatch, capsys):
    world = World(plan_of(tmp_path, timeout_s=6.0), {(1, 0): (FOREVER, FINISH)})
    code, rows = supervise(name, world, monkeypatch)
    assert (code, rows) == (0, [])
    assert 3.0 + 66.0 < world.clock.t < 3.0 + 66.0 + 1.0, world.clock.t
    assert "replica group(s) [1] did not finish 66 s after the first" in capsys.readouterr().err


@pytest.mark.parametrize("name", sorted(ADAPTERS))
def test_a_group_that_fails_after_another_finished_is_not_restarted(name, tmp_path, monkeypatch, capsys):
    world = World(plan_of(tmp_path), {(1, 0): (10.0, -signal.SIGKILL)})
    code, rows = supervise(name, world, monkeypatch)
    assert (code, rows) == (0, []) and [start[:2] for start in world.started] == [(0, 0), (1, 0)]
    assert "replica group 1 ended after another group had finished; not restarted" in capsys.readouterr().err


def test_srun_a_step_that_ends_with_0_without_the_finished_mark_is_a_node_failure(tmp_path, monkeypatch):
    world = World(plan_of(tmp_path), {})
    world.popen = every_rank_ends(world)  # no finished mark: srun's 0 after a node failure
    world.script = {(1, 0): (1.0, FINISH)}
    processes = srun_adapter(world, monkeypatch)
    clock = world.clock.clock()
    supervisor = ReplicaSupervisor(replace(world.plan, max_restarts=0), processes, processes.folder, clock)
    assert supervisor.run() == 1  # the first failure ends the run: srun's 0 was not the group's finish


def test_srun_a_restart_waits_for_a_usable_node(tmp_path, monkeypatch):
    """No spare, and group 1's own node down: the restart waits, looking every NODE_WAIT_S, until Slurm has it back."""
    world = World(plan_of(tmp_path, spare_nodes=0), {(0, 0): (40.0, FINISH), (1, 0): (1.0, -signal.SIGKILL)})
    states = {"n2": "down", "n3": "down"}
    processes = srun_adapter(world, monkeypatch, states)
    supervisor = ReplicaSupervisor(world.plan, processes, processes.folder, world.clock.clock())
    original_sleep = world.clock.sleep

    def sleep(seconds: float) -> None:
        original_sleep(seconds)
        if world.clock.t > 2.0 + 3 * srun_groups.NODE_WAIT_S:
            states["n2"] = "idle"

    supervisor.clock = supervisor.clock._replace(sleep=sleep)
    assert supervisor.run() == 0
    rows = replicas.read_events(processes.folder)
    assert [(row["event"], row.get("where")) for row in rows] == [("failed", None), ("restarted", "n2")]
    assert rows[0]["cause"] == "node DOWN" and rows[1]["s"] - rows[0]["s"] > 3 * srun_groups.NODE_WAIT_S


# -- the plan --------------------------------------------------------------------------------------------------------
NODE = {"replica_groups": 3, "min_replicas": 1, "timeout_s": 60, "heartbeat_timeout_s": 5, "spare_nodes": 1}


@pytest.mark.parametrize(("nodes", "tasks", "group_nodes", "group_tasks"), [(3, 4, 1, 4), (6, 2, 2, 2), (1, 6, 1, 2)])
def test_the_plan_lays_each_group_out_from_the_job_layout(nodes, tasks, group_nodes, group_tasks, tmp_path):
    layout = JobLayout("ddp", nodes=nodes, tasks_per_node=tasks, gpus_per_node=tasks, gpus_per_task=1, cpus_per_task=1)
    plan = replica_plan(layout, {**NODE, "max_restarts": 3}, tmp_path)
    assert (plan.groups, plan.group_nodes, plan.tasks_per_node) == (3, group_nodes, group_tasks)
    assert plan.group_size * plan.groups == layout.world_size and plan.run_dir == str(tmp_path.absolute())


def test_the_plan_reaches_the_batch_host_as_its_own_text_and_a_stranger_is_refused_by_name(tmp_path):
    plan = plan_of(tmp_path)
    assert ReplicaPlan.from_text(plan.text()) == plan
    record = plan.record()
    with pytest.raises(ValueError, match=r"missing \['max_restarts'\], unknown \['retries'\]"):
        ReplicaPlan.from_record({**{k: v for k, v in record.items() if k != "max_restarts"}, "retries": 3})
