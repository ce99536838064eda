"""Start a job's processes on this machine, torchrun-style, and watch them.

Each task of the layout becomes one ``python -m hpc_train.compute.worker`` process with
RANK/LOCAL_RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT set, marked ``HPC_TRAIN_LOCAL_LAUNCHER=1``
(rank detection trusts those variables only with a marker: see hpc_train.compute.runtime.ranks). Rank 0
keeps the console (progress bar); the others write to ``logs/rank<r>.out``. If one process fails, the others are
stopped so a broken run never hangs; a hung job is ended by the ranks' own watchdog (hpc_train.records.hang), whose
message this launcher prints.

Stop signals (SIGTERM, SIGINT, SIGUSR1, SIGUSR2) sent to the launcher are forwarded to every rank. Ctrl-C
reaches the ranks twice (from the terminal, which signals the whole process group, and forwarded): a rank
takes two stop signals less than a second apart as one (hpc_train.compute.runtime.heartbeat.REPEAT_WINDOW_S).
"""

from __future__ import annotations

import os
import shlex
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import IO, Any, Callable, ContextManager, Dict, List, Optional, Tuple

from hpc_train.config.view import plain
from hpc_train.containers.job_step import LocalContainer, local_container
from hpc_train.containers.settings import ContainerSettings
from hpc_train.launch.planning.plan import RunPlan, count_local_gpus
from hpc_train.processes.procfs import oom_kills
from hpc_train.processes.rank_env import MASTER_FD_VARIABLE
from hpc_train.processes.script_command import is_script_job
from hpc_train.processes.signal_relay import handling, relay_to
from hpc_train.processes.warm_ranks import start_rank
from hpc_train.records import hang, rundir
from hpc_train.records.metrics_log import LAUNCH_ID_VARIABLE, LOCAL_LAUNCHER_VARIABLE
from hpc_train.records.rank_errors import OOM_KILL_KNOWN, death_cause, is_sigkill, read_records, root_cause

GRACE_S = 10.0
BACKLOG = 128  # connections to the rendezvous queued before rank 0's store accepts them
CONTAINER_FILES = "container"  # the run dir's folder of what a local run in an image needs (an OCI task's bundle)


def free_port() -> int:
    """A port free now; another process may take it before the rank that binds it starts (see master_listener)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def master_listener() -> socket.socket:
    """The rendezvous's socket, bound to a free port and listening from now on: rank 0 inherits it
    (MASTER_FD_VARIABLE) and serves its store on it, so the port cannot be taken between the launcher's choice and
    rank 0's start; the other ranks' connections wait in its queue meanwhile."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(BACKLOG)
    return sock


def worker_env(rank: int, world: int, port: int, threads: int, launch_id: str = "") -> Dict[str, str]:
    env = dict(os.environ)
    # A stale Slurm/torchrun environment (e.g. running inside an allocation) must not leak in.
    for key in [k for k in env if k.startswith(("SLURM_", "SUBMITIT_", "TORCHELASTIC_")) or k == MASTER_FD_VARIABLE]:
        del env[key]
    env.update(
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(world),
        LOCAL_WORLD_SIZE=str(world),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        PYTHONUNBUFFERED="1",
    )
    env[LOCAL_LAUNCHER_VARIABLE] = "1"
    env[LAUNCH_ID_VARIABLE] = launch_id  # names this attempt on every rank (a script job counts its attempts)
    env.setdefault("OMP_NUM_THREADS", str(threads))
    return env


def stop(procs: List[subprocess.Popen], sig: int = signal.SIGTERM) -> None:
    """Send `sig` to each process still running; kill those still running GRACE_S later."""
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(sig)
    deadline = time.monotonic() + GRACE_S
    for proc in procs:
        try:
            proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def run_image(plan: RunPlan, stage: bool) -> Optional[LocalContainer]:
    """The image every local rank of `plan` runs in (None: no container); `stage`: hpc_train's library copied now."""
    return local_container(
        ContainerSettings.from_section(plain(plan.config.get("container"))),
        [str(plan.run_dir.absolute().parent)],
        count_local_gpus() > 0,
        plan.run_dir.absolute() / CONTAINER_FILES,
        stage=stage,
    )


def container_line(plan: RunPlan) -> Optional[str]:
    """The dry run's words for what each rank runs in the image (None: no container); nothing is written."""
    image = run_image(plan, stage=False)
    if image is None:
        return None
    module_args = ["-m", "hpc_train.compute.worker", str(plan.run_dir.absolute() / "job_config.yaml")]
    command = shlex.join(image.step.argv(module_args))
    removed = ", ".join(image.step.unset)
    runner = image.runtime.local_runner(image.settings, image.ctx, "<rank>")
    where = f"{shlex.join(runner)} with config.json's process: " if runner else ""
    return f"each rank runs, in the image: {where}{command} (the environment without {removed})"


def run_local(plan: RunPlan, config_path: Path, master_port: Optional[int] = None) -> int:
    """Run every task of the plan on this machine; return the job's exit code (0: all ranks succeeded)."""
    image = run_image(plan, stage=True)
    listener = _listener(plan, image, master_port)
    port = master_port or (listener.getsockname()[1] if listener else free_port())
    (plan.run_dir / rundir.LOGS).mkdir(parents=True, exist_ok=True)
    procs: List[subprocess.Popen] = []
    files: List[IO[str]] = []
    try:
        with forwarding_stop_signals(procs):
            try:
                _start_ranks(plan, config_path, image, listener, port, procs, files)
                return _watch(procs, plan.run_dir, started=time.time())
            except KeyboardInterrupt:  # a Ctrl-C before the ranks started, or a third one: stop at once
                stop(procs, signal.SIGINT)
                return rundir.EXIT_CTRL_C
    finally:
        stop(procs)
        for handle in files:
            handle.close()
        if listener is not None:
            listener.close()


def _start_ranks(
    plan: RunPlan,
    config_path: Path,
    image: Optional[LocalContainer],
    listener: Optional[socket.socket],
    port: int,
    procs: List[subprocess.Popen],
    files: List[IO[str]],
) -> None:
    """Start each rank into `procs` as it starts (a stop signal meanwhile reaches those started); rank 0 keeps the
    console, the others write to their files, kept in `files`."""
    world = plan.layout.world_size
    threads = max(1, (os.cpu_count() or 1) // world)
    module_args = ["-m", "hpc_train.compute.worker", str(config_path)]
    launch_id = f"{os.getpid()}-{time.time_ns()}"
    for rank in range(world):
        out = None if rank == 0 else open(rundir.rank_output(plan.run_dir, rank), "w")
        if out is not None:
            files.append(out)
        command, env = [sys.executable, *module_args], worker_env(rank, world, port, threads, launch_id)
        passed: Tuple[int, ...] = ()
        if listener is not None:
            env[MASTER_FD_VARIABLE] = str(listener.fileno())
            passed = (listener.fileno(),) if rank == 0 else ()
        if image is not None:  # the image's Python runs the rank (hpc_train.containers)
            command, env = image.task(module_args, env, f"hpc-train-{os.getpid()}-{rank}")
        procs.append(start_rank(command, env, out, passed))
    if listener is not None:
        listener.close()  # rank 0 holds it now


def _listener(plan: RunPlan, image: Optional[LocalContainer], master_port: Optional[int]) -> Optional[socket.socket]:
    """The rendezvous's socket handed to rank 0 (master_listener); None where rank 0 binds the port itself: a
    port the user chose, one rank, a script job (the user's script binds it), ranks in an image."""
    handed = not master_port and plan.layout.world_size > 1 and image is None and not is_script_job(plan.config)
    return master_listener() if handed else None


STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGUSR2)


def stop_forwarder(procs: List[subprocess.Popen]) -> Callable[[int, Any], None]:
    """Stop signals sent to the launcher reach every rank: they checkpoint after the current step and stop (a second
    one stops them at once). A third SIGINT stops the launcher itself (KeyboardInterrupt), killing the ranks."""
    received: Dict[int, int] = {}
    relay = relay_to(procs)

    def forward(signum: int, frame: Any) -> None:
        received[signum] = received.get(signum, 0) + 1
        if signum == signal.SIGINT and received[signum] > 2:
            raise KeyboardInterrupt
        relay(signum, frame)

    return forward


def forwarding_stop_signals(procs: List[subprocess.Popen]) -> ContextManager[bool]:
    """Inside, STOP_SIGNALS go to `procs` (stop_forwarder); the launcher's own handlers come back after."""
    return handling(STOP_SIGNALS, stop_forwarder(procs))


def oom_known(code: int, before: int) -> str:
    """What hpc_train knows of a SIGKILL's sender: the out-of-memory killer, when this cgroup's count of OOM kills
    grew since `before`; "" when it cannot tell."""
    return OOM_KILL_KNOWN if is_sigkill(code) and (oom_kills() or 0) > before else ""


def _watch(procs: List[subprocess.Popen], run_dir: Path, started: float) -> int:
    """Wait for all ranks; on the first failure stop the rest and report which rank failed first."""
    oom_before = oom_kills() or 0  # a SIGKILL while the cgroup's count of OOM kills grew is the OOM killer's
    while True:
        codes = [proc.poll() for proc in procs]
        failed = [(rank, code) for rank, code in enumerate(codes) if code not in (None, 0)]
        if failed:
            rank, code = failed[0]
            if code == rundir.EXIT_REFUSED:  # the rank said why in one line (on the console already)
                stop(procs)
                return code
            if code == rundir.EXIT_HUNG:  # the watchdog's verdict: print it, the ranks are leaving by themselves
                verdict = hang.read_request(run_dir, since=started) or {}
                print(verdict.get("message") or "hpc-train: the job hung (see logs/rank<r>.log)", file=sys.stderr)
                stop(procs)
                return code
            if code == rundir.EXIT_INTERRUPTED:  # the others stop at the same step
                print(f"hpc-train: rank {rank} stopped (signal).", file=sys.stderr)
                deadline = time.monotonic() + GRACE_S
                while time.monotonic() < deadline and any(p.poll() is None for p in procs):
                    time.sleep(0.1)
                stop(procs)
                return code
            # The process that exits first is often a peer that lost its connection: name the root cause.
            first, record = root_cause(failed, read_records(run_dir, len(procs), since=started))
            if record is not None:
                print(
                    f"hpc-train: rank {first} failed first ({record['error']}); stopping the other ranks. "
                    f"Its traceback: {rundir.rank_log(run_dir, first)}",
                    file=sys.stderr,
                )
            else:  # died without a word of its own: a signal (the OOM killer, a segfault) or a bare exit status
                peers = sorted(rank for rank, _ in failed if rank != first)
                consequence = (
                    f" (rank{'s' if len(peers) > 1 else ''} {', '.join(map(str, peers))} then lost the connection:"
                    " a consequence, not the cause)"
                    if peers
                    else ""
                )
                print(
                    f"hpc-train: rank {first} (pid {procs[first].pid})"
                    f" {death_cause(codes[first], oom_known(codes[first], oom_before))}{consequence};"
                    f" stopping the other ranks. Its log: {rundir.rank_log(run_dir, first)}",
                    file=sys.stderr,
                )
            stop(procs)
            return code if code > 0 else 1
        if all(code == 0 for code in codes):
            return 0
        time.sleep(0.2)
