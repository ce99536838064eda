"""A local run made of replica groups (``fault_tolerance.replica_groups``): the lighthouse, the groups, restarts.

Each group is started as a job of its own (its ranks numbered from 0, its own rendezvous port) with the variables
that name its group (hpc_train.processes.rank_env); the lighthouse (torchft's quorum server,
``python -m hpc_train.compute.replicas.lighthouse``) runs beside them for as long as the run does. When a process of a
group dies, this launcher stops the rest of that group and starts it again (at most ``fault_tolerance.max_restarts``
times a group); the other groups train on and the restarted one rejoins from a live group. A refusal, a stop signal
or a hang of the whole job ends the run as without groups. Once a group has finished training, a group still running
gets ``timeout_s`` plus a minute to finish too (it may be rejoining), then is stopped.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional

from hpc_train.containers.job_step import LocalContainer
from hpc_train.launch.backends.local.processes import (
    GRACE_S,
    _forward_stop_signals,
    _stop,
    free_port,
    oom_known,
    run_image,
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

# Exits that end the whole run; a group that hangs (its watchdog's EXIT_HUNG) is restarted like one that died
ENDING = (rundir.EXIT_REFUSED, rundir.EXIT_INTERRUPTED)


class Groups:
    def __init__(
        self,
        plan: RunPlan,
        config_path: Path,
        lighthouse: str,
        view: List[subprocess.Popen],
        image: Optional[LocalContainer] = None,
    ) -> None:
        node = plan.config.fault_tolerance
        self.groups, self.timeout_s = int(node.replica_groups), float(node.timeout_s)
        self.max_restarts = int(node.max_restarts)
        self.size = plan.layout.world_size // self.groups
        self.run_dir, self.config_path, self.lighthouse = plan.run_dir, config_path, lighthouse
        self.threads = max(1, (os.cpu_count() or 1) // plan.layout.world_size)
        self.launch_id = f"{os.getpid()}-{time.time_ns()}"
        # The attempt's folder, where the groups' failures and restarts are recorded for the ranks to write up
        self.folder = replicas.attempt_folder(self.run_dir, {LAUNCH_ID_VARIABLE: self.launch_id})
        self.oom_kills = oom_kills() or 0  # the OOM kills this launcher's cgroup counted so far
        self.procs: Dict[int, List[subprocess.Popen]] = {}
        self.restarts = {g: 0 for g in range(self.groups)}
        self.files: List = []
        self.view = view  # every live process, which the stop signals are forwarded to
        self.image = image  # the container every rank runs in (None: this machine's Python)

    @property
    def all_procs(self) -> List[subprocess.Popen]:
        return [proc for procs in self.procs.values() for proc in procs]

    def start(self, group: int) -> None:
        port = free_port()
        procs = []
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
                    REPLICA_GROUPS_VARIABLE: str(self.groups),
                    REPLICA_RESTART_VARIABLE: str(self.restarts[group]),
                    LIGHTHOUSE_VARIABLE: self.lighthouse,
                }
            )
            module_args = ["-m", "hpc_train.compute.worker", str(self.config_path)]
            command = [sys.executable, *module_args]
            if self.image is not None:  # the image's Python runs the rank, as without groups (hpc_train.containers)
                name = f"hpc-train-{os.getpid()}-g{group}.{self.restarts[group]}-{rank}"
                command, env = self.image.task(module_args, env, name)
            procs.append(subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT if out else None))
        self.procs[group] = procs
        self.view[:] = self.all_procs

    def watch(self, started: float) -> int:
        finished_at: Optional[float] = None
        done: Dict[int, bool] = {g: False for g in range(self.groups)}
        while True:
            for group, procs in list(self.procs.items()):
                if done[group]:
                    continue
                codes = [proc.poll() for proc in procs]
                failed = [(rank, code) for rank, code in enumerate(codes) if code not in (None, 0)]
                if failed and finished_at is not None:  # the run is complete: a late group is not started again
                    _stop([p for p in procs if p.poll() is None], signal.SIGKILL)
                    done[group] = True
                    print(
                        f"hpc-train: replica group {group} ended after the other groups had finished; not restarted",
                        file=sys.stderr,
                    )
                elif failed:
                    rank, code = failed[0]
                    if code in ENDING:
                        return self._end(code, started)
                    if self.restarts[group] >= self.max_restarts:
                        print(
                            f"hpc-train: replica group {group} failed {self.restarts[group] + 1} times"
                            f" (fault_tolerance.max_restarts={self.max_restarts}); stopping the run.",
                            file=sys.stderr,
                        )
                        return code if code > 0 else 1
                    self._restart(group, group * self.size + rank, code, started)
                elif all(code == 0 for code in codes):
                    done[group] = True
                    finished_at = finished_at or time.monotonic()
            if all(done.values()):
                return 0
            if finished_at is not None and time.monotonic() - finished_at > self.timeout_s + 60:
                late = sorted(g for g, d in done.items() if not d)
                print(
                    f"hpc-train: replica group(s) {late} did not finish {self.timeout_s + 60:.0f} s after the others;"
                    " stopping them (the run is complete).",
                    file=sys.stderr,
                )
                return 0
            time.sleep(0.2)

    def _restart(self, group: int, global_rank: int, code: int, started: float) -> None:
        """Group `group` lost rank `global_rank` (exit status `code`): its failure on record and on the console, the
        rest of it stopped, and the group started again."""
        _stop([p for p in self.procs[group] if p.poll() is None], signal.SIGKILL)
        known = oom_known(code, self.oom_kills)
        who, cause = f"rank {global_rank} {death_cause(code, known)}", short_cause(code)
        rank = f"rank {global_rank}"
        if code == rundir.EXIT_HUNG:  # the watchdog of the group named the culprit: its words first
            verdict = hang.read_request(self.run_dir, since=started) or {}
            print(verdict.get("message") or f"hpc-train: replica group {group} hung", file=sys.stderr)
            who, cause = "hung (above: the rank that stopped it)", "hung"
            culprits = verdict.get("culprits") or []
            rank = ", ".join(f"rank {r}" for r in culprits) if culprits else None
        elif known:
            cause = OOM_CAUSE.format(signal=short_cause(code))
        replicas.append_event(
            self.folder, replicas.FAILED, group, time.time(), who=rank, cause=cause, restart=self.restarts[group]
        )
        self.restarts[group] += 1
        print(
            f"hpc-train: replica group {group}: {who}; the other groups"
            f" train on; restarting group {group} ({self.restarts[group]} of at most"
            f" {self.max_restarts}). Its log: {rundir.rank_log(self.run_dir, global_rank)}",
            file=sys.stderr,
            flush=True,
        )
        # On record before its processes start: whoever meets the restarted group (its own ranks, the live groups in
        # the quorum it joins) finds its restart in the file, and its rows come failed, restarted, rejoined
        replicas.append_event(self.folder, replicas.RESTARTED, group, time.time(), restart=self.restarts[group])
        self.start(group)
        self.oom_kills = oom_kills() or 0

    def _end(self, code: int, started: float) -> int:
        if code == rundir.EXIT_INTERRUPTED:
            deadline = time.monotonic() + GRACE_S
            while time.monotonic() < deadline and any(p.poll() is None for p in self.all_procs):
                time.sleep(0.1)
        return code


def run_groups(plan: RunPlan, config_path: Path) -> int:
    """Run the plan's replica groups and their lighthouse on this machine; the job's exit code."""
    run_dir = plan.run_dir
    (run_dir / rundir.LOGS).mkdir(parents=True, exist_ok=True)
    node = plan.config.fault_tolerance
    port = free_port()
    lighthouse_log = open(run_dir / rundir.LOGS / replicas.LIGHTHOUSE_LOG, "a")
    lighthouse = subprocess.Popen(
        replicas.lighthouse_command(sys.executable, port, node),
        stdout=lighthouse_log,
        stderr=subprocess.STDOUT,
    )
    procs_view: List[subprocess.Popen] = []
    groups = Groups(plan, config_path, f"http://127.0.0.1:{port}", procs_view, run_image(plan, stage=True))
    forwarded = _forward_stop_signals(procs_view)
    try:
        for group in range(groups.groups):
            groups.start(group)
        return groups.watch(started=time.time())
    except KeyboardInterrupt:
        _stop(groups.all_procs, signal.SIGINT)
        return rundir.EXIT_CTRL_C
    finally:
        for signum, previous in forwarded.items():
            signal.signal(signum, previous)
        _stop(groups.all_procs)
        _stop([lighthouse])
        lighthouse_log.close()
        for handle in groups.files:
            handle.close()
