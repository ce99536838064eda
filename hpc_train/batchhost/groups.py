"""A Slurm job made of replica groups, run by its batch host's agent: the lighthouse, one job step per group, and
a failed group's step started again on a node the job still holds.

The job is one allocation of the groups' nodes plus ``fault_tolerance.spare_nodes``, submitted with ``--no-kill``:
a node that fails leaves the allocation and takes down only the step of the group on it (srun ends that step; the
others run on). This process starts the lighthouse here, on the batch host, then each group as an srun step on its
own nodes (``--nodelist``), with the variables that name its group and its own rendezvous port. When a group's step
ends before the group has finished training (its rank 0 leaves a ``finished`` mark; srun reports 0 after a node
failure too), the group is started again on nodes of the allocation that no live group uses and Slurm reports
usable, a spare first, at most ``max_restarts`` times. Once one group has finished, the others get ``timeout_s`` plus
a minute to finish too. If the batch host itself fails, Slurm ends the whole job (the batch step with it): it is
then requeued and resumed from its last checkpoint as a job without groups would be.

A group's tasks run hpc_train's group task (hpc_train.compute.entry.group_task) where the job's command names
submitit's: every group's step has a task of rank 0, and submitit's entry would have each of them write the job's one
result file (a job's end is Slurm's state and the run's records, not a group's return value).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from hpc_train.processes.rank_env import (
    LIGHTHOUSE_VARIABLE,
    REPLICA_GROUP_VARIABLE,
    REPLICA_GROUPS_VARIABLE,
    REPLICA_RESTART_VARIABLE,
    port_for_job,
)
from hpc_train.records import replicas as marks
from hpc_train.records import rundir
from hpc_train.records.metrics_log import LAUNCH_ID_VARIABLE
from hpc_train.records.rank_errors import NODE_DOWN_KNOWN, OOM_CAUSE, SLURM_OOM_KNOWN, death_cause, short_cause
from hpc_train.records.rundir import EXIT_HUNG, EXIT_INTERRUPTED, EXIT_REFUSED
from hpc_train.slurm import slurm_cli
from hpc_train.slurm.hostlist import expand_hostlist

RELAYED = (signal.SIGUSR1, signal.SIGUSR2, signal.SIGTERM, signal.SIGINT, signal.SIGCONT)
ENDING = (EXIT_REFUSED, EXIT_INTERRUPTED)  # a group's exit that ends the whole job; a hung group is restarted
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


def describe(plan: Dict) -> str:
    return f"{plan['groups']} replica groups of {plan['group_nodes']} node(s) and {plan['spare_nodes']} spare node(s)"


class GroupSteps:
    def __init__(self, plan: Dict, srun: List[str], env: Dict[str, str]) -> None:
        self.plan, self.srun, self.env = plan, group_command(srun), env
        self.groups, self.group_nodes = int(plan["groups"]), int(plan["group_nodes"])
        self.tasks = int(plan["tasks_per_node"]) * self.group_nodes
        self.folder = marks.attempt_folder(Path(plan["run_dir"]), env)
        self.steps: Dict[int, subprocess.Popen] = {}
        self.nodes: Dict[int, List[str]] = {}
        self.restarts = {g: 0 for g in range(self.groups)}
        job = env.get("SLURM_JOB_ID", "0")
        self.port = port_for_job(job) + 1  # the groups' rendezvous ports follow the job's own
        self.lighthouse: Optional[subprocess.Popen] = None

    # -- the lighthouse ---------------------------------------------------------------------------------
    def start_lighthouse(self) -> str:
        with socket.socket() as sock:
            sock.bind(("", 0))
            port = sock.getsockname()[1]
        log = open(Path(self.plan["run_dir"]) / rundir.LOGS / marks.LIGHTHOUSE_LOG, "a")
        self.lighthouse = subprocess.Popen(
            marks.lighthouse_command(sys.executable, port, self.plan),
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        return f"http://{socket.getfqdn()}:{port}"

    # -- the groups' steps ------------------------------------------------------------------------------
    def start(self, group: int, nodes: List[str], lighthouse: str) -> None:
        env = dict(self.env)
        env.update(
            {
                REPLICA_GROUP_VARIABLE: str(group),
                REPLICA_GROUPS_VARIABLE: str(self.groups),
                REPLICA_RESTART_VARIABLE: str(self.restarts[group]),
                LIGHTHOUSE_VARIABLE: lighthouse,
                LAUNCH_ID_VARIABLE: self.folder.name,
                "MASTER_PORT": str(self.port + group),
            }
        )
        srun = [shutil.which(self.srun[0]) or self.srun[0], *self.srun[1:]]
        where = ["--nodes", str(self.group_nodes), "--ntasks", str(self.tasks), "--nodelist", ",".join(nodes)]
        if group or self.restarts[group]:  # srun's own logs: one pair per group's start (the first group's as before)
            srun = [word.replace("%j_%t", f"%j_group{group}.{self.restarts[group]}_%t") for word in srun]
        self.steps[group], self.nodes[group] = subprocess.Popen([srun[0], *where, *srun[1:]], env=env), nodes
        print(f"hpc-train: replica group {group} on {','.join(nodes)}", file=sys.stderr, flush=True)

    def finished(self, group: int) -> bool:
        return marks.finished_file(self.folder, group).exists()

    def free_nodes(self) -> List[str]:
        """Nodes of the allocation (as it is now: a failed node has left it) that no running group uses and Slurm
        reports usable; the spare nodes come first (the groups were laid out from the front)."""
        job = self.env.get("SLURM_JOB_ID", "")
        held = expand_hostlist(slurm_cli.show_job(job).get("NodeList", "") or self.env.get("SLURM_JOB_NODELIST", ""))
        busy = {node for g, step in self.steps.items() if step.poll() is None for node in self.nodes[g]}
        states = self.node_states()
        free = [node for node in held if node not in busy and states.get(node, "idle") in USABLE]
        return sorted(free, key=lambda node: held.index(node) < self.groups * self.group_nodes)

    def run(self) -> int:
        lighthouse = self.start_lighthouse()
        held = expand_hostlist(self.env.get("SLURM_JOB_NODELIST", ""))
        print(f"hpc-train: {describe(self.plan)}; lighthouse {lighthouse}", file=sys.stderr, flush=True)
        previous = {signum: signal.signal(signum, self._relay) for signum in RELAYED}
        try:
            for group in range(self.groups):
                self.start(group, held[group * self.group_nodes : (group + 1) * self.group_nodes], lighthouse)
            return self._watch(lighthouse)
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)
            for step in self.steps.values():
                if step.poll() is None:
                    step.terminate()
            if self.lighthouse is not None:
                self.lighthouse.terminate()

    def _relay(self, signum: int, _frame: object) -> None:
        for step in self.steps.values():
            if step.poll() is None:
                step.send_signal(signum)

    def _failed(self, group: int, code: int) -> None:
        """Group `group`'s step ended with srun's status `code` before the group finished: on the console and on
        record (the attempt's events.jsonl, which the ranks write up), with what Slurm knows of its nodes."""
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
        print(
            f"hpc-train: replica group {group}'s step on {nodes} ended ({how}) before the group finished; the other"
            f" groups train on; restarting group {group} on free nodes ({self.restarts[group] + 1} of at most"
            f" {self.plan['max_restarts']})",
            file=sys.stderr,
            flush=True,
        )
        marks.append_event(
            self.folder, marks.FAILED, group, time.time(), who=nodes, cause=cause, restart=self.restarts[group]
        )

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

    def _watch(self, lighthouse: str) -> int:
        waiting: List[int] = []  # groups to restart once nodes are free
        done_at: Optional[float] = None
        while True:
            for group, step in self.steps.items():
                code = step.poll()
                if code is None or group in waiting or self.restarts[group] < 0:
                    continue
                if self.finished(group):
                    self.restarts[group] = -1  # done
                    done_at = done_at or time.monotonic()
                    continue
                if done_at is not None:  # the run is complete: a late group is not started again
                    self.restarts[group] = -1
                    continue
                if code in ENDING:
                    return code
                if self.restarts[group] >= int(self.plan["max_restarts"]):
                    print(
                        f"hpc-train: replica group {group} failed {self.restarts[group] + 1} times"
                        f" (fault_tolerance.max_restarts={self.plan['max_restarts']}); ending the job.",
                        file=sys.stderr,
                        flush=True,
                    )
                    return code or 1
                self._failed(group, code)
                waiting.append(group)
            for group in list(waiting):
                free = self.free_nodes()
                if len(free) < self.group_nodes:
                    break
                waiting.remove(group)
                self.restarts[group] += 1
                nodes, restart = free[: self.group_nodes], self.restarts[group]
                marks.append_event(  # on record before its step starts, as the local launcher does
                    self.folder, marks.RESTARTED, group, time.time(), restart=restart, where=",".join(nodes)
                )
                self.start(group, nodes, lighthouse)
            if all(count < 0 for count in self.restarts.values()):
                return 0
            limit = float(self.plan["timeout_s"]) + 60
            if done_at is not None and time.monotonic() - done_at > limit:
                print(
                    f"hpc-train: the other replica groups did not finish {limit:.0f} s after the first; stopping them",
                    file=sys.stderr,
                    flush=True,
                )
                return 0
            time.sleep(NODE_WAIT_S if waiting else 0.5)


def run_groups(plan_json: str, srun: List[str], env: Dict[str, str]) -> int:
    """The job's groups to the end; the job's exit status."""
    plan = json.loads(plan_json)
    os.makedirs(Path(plan["run_dir"]) / rundir.LOGS, exist_ok=True)
    return GroupSteps(plan, srun, env).run()
