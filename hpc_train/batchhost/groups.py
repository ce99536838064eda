"""A Slurm job made of replica groups, run by its batch host's agent: the lighthouse, and each group as an srun job
step on nodes the job holds, under the groups' supervisor (hpc_train.batchhost.supervisor: the restart policy, the
late groups' grace, the records).

The job is one allocation of the groups' nodes plus ``fault_tolerance.spare_nodes``, submitted with ``--no-kill``:
a node that fails leaves the allocation and takes down only the step of the group on it (srun ends that step; the
others run on). This process starts the lighthouse here, on the batch host, then each group as an srun step on its
own nodes (``--nodelist``), with the variables that name its group and its own rendezvous port. A group's step that
ends before the group has finished training (its rank 0 leaves a ``finished`` mark; srun reports 0 after a node
failure too) is put in words from what Slurm knows (sinfo's state of its nodes, sacct's of its step) and started
again on nodes of the allocation that no live group uses and Slurm reports usable, a spare first. If the batch host
itself fails, Slurm ends the whole job (the batch step with it): it is then requeued and resumed from its last
checkpoint as a job without groups would be.

The plan of the groups comes on the agent's command line (``--replicas``) as the text of
hpc_train.contracts.replica_plan.ReplicaPlan.

A group's tasks run hpc_train's group task (hpc_train.compute.entry.group_task) where the job's command names
submitit's: every group's step has a task of rank 0, and submitit's entry would have each of them write the job's one
result file (a job's end is Slurm's state and the run's records, not a group's return value).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from hpc_train.batchhost.supervisor import Failure, ReplicaSupervisor
from hpc_train.contracts.replica_plan import ReplicaPlan
from hpc_train.processes.rank_env import (
    LIGHTHOUSE_VARIABLE,
    REPLICA_GROUP_VARIABLE,
    REPLICA_GROUPS_VARIABLE,
    REPLICA_RESTART_VARIABLE,
    step_port,
)
from hpc_train.processes.signal_relay import RELAYED, handling, relay_to
from hpc_train.records import replicas as marks
from hpc_train.records import rundir
from hpc_train.records.metrics_log import LAUNCH_ID_VARIABLE
from hpc_train.records.rank_errors import NODE_DOWN_KNOWN, OOM_CAUSE, SLURM_OOM_KNOWN, death_cause, short_cause
from hpc_train.records.rundir import EXIT_HUNG
from hpc_train.slurm import slurm_cli
from hpc_train.slurm.hostlist import expand_hostlist

USABLE = ("idle", "mix", "alloc", "allocated", "mixed", "completing")  # sinfo's states of a node that can run a step
NODE_WAIT_S = 5.0  # between two looks for nodes to restart a group on
SRUN_ZERO = "srun says so when a node of its step failed (Slurm may have returned the node to service since)"
SUBMITIT_TASK = "submitit.core._submit"  # submitit's task entry, the module the job step's command runs
GROUP_TASK = "hpc_train.compute.entry.group_task"  # the same task for a group's step, without a result file
OUT_OF_MEMORY = "OUT_OF_MEMORY"  # sacct's state of a step that its cgroup's out-of-memory killer ended
NOT_ENDED = ("", "PENDING", "RUNNING", "COMPLETING")  # a step's state before accounting has its end
STEP_STATE_WAIT_S = 3.0  # how long a failed group's agent waits for accounting to record its step's end


def last_step(rows: List[List[str]], job: str, nodes: List[str]) -> Optional[Tuple[str, str]]:
    """(step id, state) of the step of `job` on exactly `nodes` that started last, from sacct's rows of JobID,
    NodeList, State (the state's first word: "CANCELLED by 0" is CANCELLED); None when accounting has none."""
    found: Optional[Tuple[int, str, str]] = None
    for row in rows:
        if len(row) < 3:
            continue
        owner, _, number = row[0].partition(".")
        if owner != job or not number.isdigit() or sorted(expand_hostlist(row[1])) != sorted(nodes):
            continue
        if found is None or int(number) > found[0]:
            found = (int(number), row[0], (row[2].split() or [""])[0])
    return None if found is None else (found[1], found[2])


def slurm_oom_known(step: Optional[Tuple[str, str]]) -> str:
    """What Slurm's accounting tells of a failed step: the out-of-memory killer when it recorded OUT_OF_MEMORY, else
    "" (another end, or no accounting: the usual cause of the exit status is said instead)."""
    return SLURM_OOM_KNOWN.format(step=step[0]) if step is not None and step[1] == OUT_OF_MEMORY else ""


def group_command(srun: List[str]) -> List[str]:
    """The job step's command as a group's step runs it: submitit's task entry swapped for the group task's."""
    return [GROUP_TASK if word == SUBMITIT_TASK else word for word in srun]


class SrunGroupSteps:
    """The groups' processes as srun job steps on the job's nodes (hpc_train.batchhost.supervisor's adapter)."""

    poll_s = 0.5
    room_wait_s = NODE_WAIT_S

    def __init__(
        self, plan: ReplicaPlan, srun: List[str], env: Dict[str, str], lighthouse: str, start_process=subprocess.Popen
    ) -> None:
        """`start_process`: subprocess.Popen, or a fake of it (the tests' process boundary)."""
        self.plan, self.srun, self.env, self.lighthouse = plan, group_command(srun), env, lighthouse
        self.start_process = start_process
        self.folder = marks.attempt_folder(Path(plan.run_dir), env)
        self.steps: Dict[int, subprocess.Popen] = {}
        self.nodes: Dict[int, List[str]] = {}
        self.job_id = env.get("SLURM_JOB_ID", "0")  # group g rendezvous on the job's step_port(g)

    def start(self, group: int, restart: int, nodes: Optional[List[str]]) -> None:
        if nodes is None:  # the group's own nodes: the groups were laid out from the front of the allocation
            held, size = expand_hostlist(self.env.get("SLURM_JOB_NODELIST", "")), self.plan.group_nodes
            nodes = held[group * size : (group + 1) * size]
        env = dict(self.env)
        env.update(
            {
                REPLICA_GROUP_VARIABLE: str(group),
                REPLICA_GROUPS_VARIABLE: str(self.plan.groups),
                REPLICA_RESTART_VARIABLE: str(restart),
                LIGHTHOUSE_VARIABLE: self.lighthouse,
                LAUNCH_ID_VARIABLE: self.folder.name,
                "MASTER_PORT": str(step_port(self.job_id, group)),
            }
        )
        srun = [shutil.which(self.srun[0]) or self.srun[0], *self.srun[1:]]
        tasks = self.plan.group_size
        where = ["--nodes", str(self.plan.group_nodes), "--ntasks", str(tasks), "--nodelist", ",".join(nodes)]
        if group or restart:  # srun's own logs: one pair per group's start (the first group's as before)
            srun = [word.replace("%j_%t", f"%j_group{group}.{restart}_%t") for word in srun]
        self.steps[group], self.nodes[group] = self.start_process([srun[0], *where, *srun[1:]], env=env), nodes
        print(f"hpc-train: replica group {group} on {','.join(nodes)}", file=sys.stderr, flush=True)

    def ended(self, group: int) -> Optional[int]:
        return self.steps[group].poll()

    def finished(self, group: int, code: int) -> bool:
        """The group's rank 0 left its finished mark (srun says 0 after a node failure too)."""
        return marks.finished_file(self.folder, group).exists()

    def room(self) -> Optional[List[str]]:
        free = self.free_nodes()
        return free[: self.plan.group_nodes] if len(free) >= self.plan.group_nodes else None

    def stop_group(self, group: int) -> None:
        """Nothing: the group's step has ended."""

    def ending(self, code: int) -> None:
        """Nothing: the other steps are stopped with the run (stop_all)."""

    def stop_all(self) -> None:
        for step in self.steps.values():
            if step.poll() is None:
                step.terminate()

    def free_nodes(self) -> List[str]:
        """Nodes of the allocation (as it is now: a failed node has left it) that no running group uses and Slurm
        reports usable; the spare nodes come first (the groups were laid out from the front)."""
        job = self.env.get("SLURM_JOB_ID", "")
        held = expand_hostlist(slurm_cli.show_job(job).get("NodeList", "") or self.env.get("SLURM_JOB_NODELIST", ""))
        busy = {node for g, step in self.steps.items() if step.poll() is None for node in self.nodes[g]}
        states = self.node_states()
        free = [node for node in held if node not in busy and states.get(node, "idle") in USABLE]
        return sorted(free, key=lambda node: held.index(node) < self.plan.groups * self.plan.group_nodes)

    def failure(self, group: int, code: int) -> Failure:
        """Group `group`'s step ended with srun's status `code` before the group finished, with what Slurm knows of
        its nodes."""
        nodes = ",".join(self.nodes[group])
        down = self.down_nodes(self.nodes[group])
        states = "/".join(sorted(set(down.values()))).upper()
        known = NODE_DOWN_KNOWN.format(nodes=",".join(down), state=states) if down else ""
        oom = "" if down or code in (0, EXIT_HUNG) else slurm_oom_known(self.ended_step(group))
        how, cause = f"srun {death_cause(code, known or oom)}", f"node {states}" if down else short_cause(code)
        if oom:
            cause = OOM_CAUSE.format(signal=cause)
        if code == 0 and not down:  # no word of Slurm's beyond srun's 0, which a node failure gives too
            how, cause = f"srun exited with code 0: {SRUN_ZERO}", "node failure (srun exit 0)"
        if code == EXIT_HUNG:
            how, cause = "hung: its watchdog named the rank above", "hung"
        said = f"'s step on {nodes} ended ({how}) before the group finished"
        return Failure(said=said, who=nodes, cause=cause, where=" on free nodes")

    def ended_step(self, group: int) -> Optional[Tuple[str, str]]:
        """(step id, state) that Slurm's accounting gives the group's step that ended, once it has its end (up to
        STEP_STATE_WAIT_S after srun's exit); None without accounting."""
        job = self.env.get("SLURM_JOB_ID", "")
        deadline = time.monotonic() + STEP_STATE_WAIT_S
        while job:
            rows = slurm_cli.sacct_steps(job, "JobID,NodeList,State")
            step = last_step(rows or [], job, self.nodes[group])
            if rows is None or (step is not None and step[1] not in NOT_ENDED) or time.monotonic() > deadline:
                return step
            time.sleep(0.5)
        return None

    def down_nodes(self, nodes: List[str]) -> Dict[str, str]:
        """The nodes among `nodes` that Slurm reports unusable (DOWN, DRAIN, FAIL, ...): node -> its state."""
        states = self.node_states()
        return {node: states[node] for node in nodes if node in states and states[node] not in USABLE}

    def node_states(self) -> Dict[str, str]:
        """sinfo's state of every node, lower case and without its flags (`idle`, `down`, `drain`, ...)."""
        states = {}
        for line in (slurm_cli.query(["sinfo", "-h", "-N", "-o", "%N %t"]) or "").splitlines():
            name, _, state = line.partition(" ")
            states[name] = state.strip().rstrip("*~#!%$@^-").lower()
        return states


def start_lighthouse(plan: ReplicaPlan) -> Tuple[subprocess.Popen, str]:
    """The lighthouse on the batch host, its log in the run dir's logs/; the process and its address."""
    with socket.socket() as sock:
        sock.bind(("", 0))
        port = sock.getsockname()[1]
    with open(Path(plan.run_dir) / rundir.LOGS / marks.LIGHTHOUSE_LOG, "a") as log:
        process = subprocess.Popen(plan.lighthouse_command(sys.executable, port), stdout=log, stderr=subprocess.STDOUT)
    return process, f"http://{socket.getfqdn()}:{port}"


def run_groups(plan_text: str, srun: List[str], env: Dict[str, str]) -> int:
    """The job's groups to the end (the agent's --replicas: the plan's text); the job's exit status."""
    plan = ReplicaPlan.from_text(plan_text)
    os.makedirs(Path(plan.run_dir) / rundir.LOGS, exist_ok=True)
    lighthouse, address = start_lighthouse(plan)
    print(f"hpc-train: {plan.describe()}; lighthouse {address}", file=sys.stderr, flush=True)
    steps = SrunGroupSteps(plan, srun, env, address)
    try:
        with handling(RELAYED, relay_to(steps.steps.values())):
            return ReplicaSupervisor(plan, steps, steps.folder).run()
    finally:
        steps.stop_all()
        lighthouse.terminate()
