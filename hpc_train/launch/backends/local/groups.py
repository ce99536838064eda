"""A local run made of replica groups (``fault_tolerance.replica_groups``): the lighthouse, and each group as
processes on this machine, under the groups' supervisor (hpc_train.batchhost.supervisor: the restart policy, the late
groups' grace, the records).

Each group is started as a job of its own (its ranks numbered from 0, its own rendezvous port) with the variables
that name its group (hpc_train.processes.rank_env); the lighthouse (torchft's quorum server,
``python -m hpc_train.compute.replicas.lighthouse``) runs beside them for as long as the run does. A group has ended
when one of its processes failed (the rest of it is then stopped) or all of them exited with 0, which is its finish.
A refusal or a stop signal ends the run as without groups; a hang of a group restarts it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from hpc_train.batchhost.supervisor import Failure, ReplicaSupervisor
from hpc_train.config.view import plain
from hpc_train.containers.job_step import LocalContainer
from hpc_train.contracts.replica_plan import ReplicaPlan, replica_plan
from hpc_train.launch.backends.local.processes import (
    GRACE_S,
    forwarding_stop_signals,
    free_port,
    oom_known,
    run_image,
    stop,
    worker_env,
)
from hpc_train.launch.planning.plan import RunPlan
from hpc_train.processes.procfs import oom_kills
from hpc_train.processes.rank_env import (
    LIGHTHOUSE_VARIABLE,
    REPLICA_GROUP_VARIABLE,
    REPLICA_GROUPS_VARIABLE,
    REPLICA_RESTART_VARIABLE,
)
from hpc_train.records import hang, replicas, rundir
from hpc_train.records.metrics_log import LAUNCH_ID_VARIABLE
from hpc_train.records.rank_errors import OOM_CAUSE, death_cause, short_cause


class LocalGroupProcesses:
    """The groups' processes on this machine (hpc_train.batchhost.supervisor's adapter)."""

    poll_s = 0.2
    room_wait_s = 0.2

    def __init__(
        self,
        plan: ReplicaPlan,
        config_path: Path,
        lighthouse: str,
        image: Optional[LocalContainer] = None,
        start_process=subprocess.Popen,
    ) -> None:
        """`image`: the container every rank runs in (None: this machine's Python); `start_process`: subprocess.Popen,
        or a fake of it (the tests' process boundary)."""
        self.plan, self.size = plan, plan.group_size
        self.run_dir, self.config_path, self.lighthouse = Path(plan.run_dir), config_path, lighthouse
        self.threads = max(1, (os.cpu_count() or 1) // (plan.groups * self.size))
        self.launch_id = f"{os.getpid()}-{time.time_ns()}"
        # The attempt's folder, where the groups' failures and restarts are recorded for the ranks to write up
        self.folder = replicas.attempt_folder(self.run_dir, {LAUNCH_ID_VARIABLE: self.launch_id})
        self.oom_kills = oom_kills() or 0  # the OOM kills this launcher's cgroup counted so far
        self.procs: Dict[int, List[subprocess.Popen]] = {}
        self.failed: Dict[int, int] = {}  # the group's rank that failed first, as ended() found it
        self.view: List[subprocess.Popen] = []  # every live process, which the stop signals are forwarded to
        self.files: List = []
        self.image, self.start_process = image, start_process
        self.started = time.time()  # a hang's verdict is read from then on

    @property
    def all_procs(self) -> List[subprocess.Popen]:
        return [proc for procs in self.procs.values() for proc in procs]

    def start(self, group: int, restart: int, nodes: Optional[List[str]]) -> None:
        port, procs = free_port(), []
        for rank in range(self.size):
            global_rank = group * self.size + rank
            out = None
            if global_rank != 0:
                out = open(rundir.rank_output(self.run_dir, global_rank), "a")
                self.files.append(out)
            env = worker_env(rank, self.size, port, self.threads, self.launch_id)
            env.update(
                {
                    REPLICA_GROUP_VARIABLE: str(group),
                    REPLICA_GROUPS_VARIABLE: str(self.plan.groups),
                    REPLICA_RESTART_VARIABLE: str(restart),
                    LIGHTHOUSE_VARIABLE: self.lighthouse,
                }
            )
            module_args = ["-m", "hpc_train.compute.worker", str(self.config_path)]
            command = [sys.executable, *module_args]
            if self.image is not None:  # the image's Python runs the rank, as without groups (hpc_train.containers)
                name = f"hpc-train-{os.getpid()}-g{group}.{restart}-{rank}"
                command, env = self.image.task(module_args, env, name)
            stderr = subprocess.STDOUT if out else None
            procs.append(self.start_process(command, env=env, stdout=out, stderr=stderr))
        self.procs[group] = procs
        self.view[:] = self.all_procs
        self.oom_kills = oom_kills() or 0

    def ended(self, group: int) -> Optional[int]:
        """The first failed rank's exit status; 0 once every rank exited with 0; None while none failed."""
        codes = [proc.poll() for proc in self.procs[group]]
        failed = [(rank, code) for rank, code in enumerate(codes) if code not in (None, 0)]
        if failed:
            self.failed[group] = failed[0][0]
            return failed[0][1]
        return 0 if all(code == 0 for code in codes) else None

    def finished(self, group: int, code: int) -> bool:
        return code == 0

    def room(self) -> Optional[List[str]]:
        return []  # this machine, at once

    def stop_group(self, group: int) -> None:
        stop([proc for proc in self.procs[group] if proc.poll() is None], signal.SIGKILL)

    def ending(self, code: int) -> None:
        """A stop signal's end: the ranks checkpoint and stop on their own, given GRACE_S before they are stopped."""
        if code == rundir.EXIT_INTERRUPTED:
            deadline = time.monotonic() + GRACE_S
            while time.monotonic() < deadline and any(p.poll() is None for p in self.all_procs):
                time.sleep(0.1)

    def failure(self, group: int, code: int) -> Failure:
        """Group `group` lost a rank (exit status `code`): the rest of it stopped, the failure in words."""
        self.stop_group(group)
        global_rank = group * self.size + self.failed[group]
        known = oom_known(code, self.oom_kills)
        said, cause = f": rank {global_rank} {death_cause(code, known)}", short_cause(code)
        who: Optional[str] = f"rank {global_rank}"
        if code == rundir.EXIT_HUNG:  # the watchdog of the group named the culprit: its words first
            verdict = hang.read_request(self.run_dir, since=self.started) or {}
            print(verdict.get("message") or f"hpc-train: replica group {group} hung", file=sys.stderr)
            said, cause = ": hung (above: the rank that stopped it)", "hung"
            culprits = verdict.get("culprits") or []
            who = ", ".join(f"rank {r}" for r in culprits) if culprits else None
        elif known:
            cause = OOM_CAUSE.format(signal=short_cause(code))
        log = f". Its log: {rundir.rank_log(self.run_dir, global_rank)}"
        return Failure(said=said, who=who, cause=cause, after=log)


def start_lighthouse(plan: ReplicaPlan) -> Tuple[subprocess.Popen, str]:
    """The lighthouse on this machine, its log in the run dir's logs/; the process and its address."""
    port = free_port()
    with open(Path(plan.run_dir) / rundir.LOGS / replicas.LIGHTHOUSE_LOG, "a") as log:
        process = subprocess.Popen(plan.lighthouse_command(sys.executable, port), stdout=log, stderr=subprocess.STDOUT)
    return process, f"http://127.0.0.1:{port}"


def run_groups(plan: RunPlan, config_path: Path) -> int:
    """Run the plan's replica groups and their lighthouse on this machine; the job's exit code."""
    (plan.run_dir / rundir.LOGS).mkdir(parents=True, exist_ok=True)
    groups = replica_plan(plan.layout, plain(plan.config.fault_tolerance), plan.run_dir)
    lighthouse, address = start_lighthouse(groups)
    processes = LocalGroupProcesses(groups, config_path, address, run_image(plan, stage=True))
    try:
        with forwarding_stop_signals(processes.view):
            return ReplicaSupervisor(groups, processes, processes.folder).run()
    except KeyboardInterrupt:
        stop(processes.all_procs, signal.SIGINT)
        return rundir.EXIT_CTRL_C
    finally:
        stop(processes.all_procs)
        stop([lighthouse])
        for handle in processes.files:
            handle.close()
