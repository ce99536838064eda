"""One task of a script job (``hpc-train ... -- train.py ARGS``): the user's script run as this rank, and watched.

The task computes the rank's environment from the launcher's (Slurm's ``SLURM_PROCID`` /
``SLURM_LOCALID`` / ``SLURM_NODEID`` in the step itself, the local launcher's variables), so no
value is expanded once for the whole job in a batch shell, then runs the script as a child
process. A one-process layout (``single``, ``dp``, ``model_parallel``, ``pipeline``) gives it no
torchrun variable at all (hpc_train.processes.rank_env), as ``python script.py`` would; a one-rank-per-GPU
layout gives it torchrun's, for this rank. Every script gets ``OMP_NUM_THREADS`` = the task's
CPUs, ``HPC_TRAIN_RUN_DIR`` and ``HPC_TRAIN_ATTEMPT``; ``CUDA_VISIBLE_DEVICES`` is left as Slurm
binds it. With ``script.launcher=torchrun`` the node's one task runs torchrun instead, which
starts the node's ranks and sets their variables itself.

Signals: the script ignores the requeue signal (an unhandled SIGUSR1/USR2 would kill it); this
task takes it, forwards ``script.signal`` if set and gives the script ``script.signal_grace_s``,
then stops the script and raises :class:`TrainingInterrupted`, so the job is requeued exactly as
hpc_train's own jobs are (rank 0 asks the batch host's agent, within ``trainer.max_requeues``). SIGTERM
(preemption, ``scancel``, ``scontrol requeue``) is forwarded at once. Every attempt after the
first appends ``script.resume_args`` (only if ``script.resume_if`` exists, when it is set).
"""

from __future__ import annotations

import collections
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO, Any, Deque, Dict, List, Mapping, Optional, Tuple

from omegaconf import DictConfig, OmegaConf

from hpc_train.compute.runtime import attempts, heartbeat
from hpc_train.compute.runtime.attempts import attempt_key
from hpc_train.compute.runtime.heartbeat import WatchdogSettings
from hpc_train.compute.runtime.interrupts import (
    NONE,
    REQUEUE,
    TERMINATE,
    LauncherSettings,
    StopFlag,
    TrainingInterrupted,
    signal_number,
)
from hpc_train.compute.runtime.ranks import RankInfo
from hpc_train.compute.settings import JobSettings, section
from hpc_train.containers.inside import image_record
from hpc_train.contracts import strategy_table
from hpc_train.contracts.job_layout import JobLayout
from hpc_train.errors import JobFailed
from hpc_train.processes import procfs
from hpc_train.processes.rank_env import is_torchrun_variable
from hpc_train.processes.script_command import direct_command, torchrun_command
from hpc_train.processes.signal_relay import handling
from hpc_train.records import hang, rundir
from hpc_train.records.metrics_log import (
    ATTEMPT_VARIABLE,
    LAUNCH_ID_VARIABLE,
    LOCAL_LAUNCHER_VARIABLE,
    RUN_DIR_VARIABLE,
)
from hpc_train.records.rank_errors import death_cause

log = logging.getLogger("hpc_train")

STOP_GRACE_S = 10.0  # after SIGTERM, how long the script may take to exit before it is killed
TAIL_LINES = 20  # lines of the script's stderr kept for the failure message
POLL_S = 0.05  # how often the task looks for a stop request: ranks forward script.signal within this of each other


class ScriptFailed(JobFailed):
    """The script exited non-zero or was killed by a signal; the message names the rank and the cause."""


@dataclass(frozen=True)
class ScriptSettings:
    """The ``script`` section: the user's script, its arguments and how it is launched, resumed and stopped."""

    argv: List[str]
    cwd: str  # the script's folder, fixed where hpc-train was started
    launcher: str  # direct | torchrun
    overrides: Mapping[str, Any]
    arg_style: str
    resume_args: List[str]
    resume_if: Optional[str]  # None: every attempt after the first resumes
    signal: Optional[str]  # None: the script is not told of the requeue signal
    signal_grace_s: float
    objective_regex: Optional[str]


@dataclass(frozen=True)
class ScriptJobSettings:
    """Every section a script job's task reads, typed. The strategy only picks the layout (`one_process`: a layout
    that runs one process, as ``python script.py`` does); `objective` is the summary's key for what the script's
    output matched (None: the spec has no objective, which a script job may leave out)."""

    script: ScriptSettings
    job: JobSettings
    launcher: LauncherSettings
    watchdog: WatchdogSettings
    one_process: bool
    objective: Optional[str]


# -- attempts -----------------------------------------------------------------------------------
def attempt_number(run_dir: Path, key: str) -> int:
    """1 + the attempts of other launches recorded in the run dir: the same on every task, whether or not rank 0
    has recorded this attempt yet."""
    return 1 + sum(1 for r in rundir.read_attempts(run_dir) if r.get("event") == "start" and r.get("key") != key)


def resumes(script: ScriptSettings, attempt: int, cwd: Path) -> bool:
    if attempt <= 1 or not script.resume_args:
        return False
    marker = script.resume_if
    return marker is None or (cwd / Path(str(marker)).expanduser()).exists()


# -- the environment ----------------------------------------------------------------------------
def node_rank(ranks: RankInfo) -> int:
    if "SLURM_NODEID" in os.environ:
        return int(os.environ["SLURM_NODEID"])
    return ranks.rank // max(1, ranks.local_world_size)


DIRECT, ONE_PROCESS, TORCHRUN = "direct", "one_process", "torchrun"  # who sets the rank variables: we, none, torchrun


def script_env(ranks: RankInfo, run_dir: Path, attempt: int, mode: str, threads: int, nodes: int) -> Dict[str, str]:
    """The script's environment: the task's own, without any rank variable it inherited (a login shell's, the local
    launcher's, a torchrun around hpc-train), plus torchrun's variables for this rank when `mode` is DIRECT."""
    env = {
        key: value
        for key, value in os.environ.items()
        if not is_torchrun_variable(key)
        and key not in (LOCAL_LAUNCHER_VARIABLE, LAUNCH_ID_VARIABLE)  # the local launcher's, for this task only
    }
    env.update({RUN_DIR_VARIABLE: str(run_dir), ATTEMPT_VARIABLE: str(attempt), "OMP_NUM_THREADS": str(threads)})
    if mode != DIRECT:  # one process, as `python script.py` runs; or torchrun, which sets every rank's variables
        return env
    node = node_rank(ranks)
    env.update(
        RANK=str(ranks.rank),
        LOCAL_RANK=str(ranks.local_rank),
        WORLD_SIZE=str(ranks.world_size),
        LOCAL_WORLD_SIZE=str(ranks.local_world_size),
        GROUP_RANK=str(node),
        GROUP_WORLD_SIZE=str(nodes),
        NODE_RANK=str(node),
        ROLE_RANK=str(ranks.rank),
        ROLE_NAME="default",
        ROLE_WORLD_SIZE=str(ranks.world_size),
        MASTER_ADDR=ranks.master_addr,
        MASTER_PORT=str(ranks.master_port),
    )
    return env


def task_threads(layout: JobLayout, per_process: int) -> int:
    """CPUs of this task (Slurm's, else the layout's), shared by the processes it starts."""
    cpus = int(os.environ.get("SLURM_CPUS_PER_TASK") or os.environ.get("OMP_NUM_THREADS") or layout.cpus_per_task)
    return max(1, cpus // max(1, per_process))


# -- running and watching -----------------------------------------------------------------------
class _Tee(threading.Thread):
    """Copies a pipe of the script to our own stream line by line, keeping the last lines and the last objective."""

    def __init__(self, source: IO[bytes], sink: IO[str], pattern: Optional[re.Pattern]) -> None:
        super().__init__(daemon=True)
        self.source, self.sink, self.pattern = source, sink, pattern
        self.lines = 0
        self.tail: Deque[str] = collections.deque(maxlen=TAIL_LINES)
        self.found: Optional[str] = None

    def run(self) -> None:
        for raw in iter(self.source.readline, b""):
            line = raw.decode(errors="replace")
            self.sink.write(line)
            self.sink.flush()
            self.tail.append(line.rstrip("\n"))
            self.lines += 1
            heartbeat.mark(hang.RUNNING, detail=f"its last line: {line.strip()[:80]}")  # output is progress
            heartbeat.warmed_up()
            if self.pattern is not None:
                match = self.pattern.search(line)
                if match:
                    self.found = match.group(1)


def _ignore(signum: int) -> Any:
    def preexec() -> None:  # in the child, before exec: the disposition survives exec
        signal.signal(signum, signal.SIG_IGN)

    return preexec


def _stop(proc: subprocess.Popen, signum: int, grace: float) -> None:
    if proc.poll() is None:
        proc.send_signal(signum)
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def run_script(cfg: DictConfig, ranks: RankInfo, run_dir: Path) -> Optional[Dict[str, Any]]:
    """Run the job's script as this rank until it ends; rank 0 returns (and writes) the summary."""
    kind = strategy_table.kind_of(cfg.strategy)
    settings = ScriptJobSettings(  # the job spec read once; nothing below reads the spec
        script=section(ScriptSettings, OmegaConf.to_container(cfg.script, resolve=True)),  # type: ignore[arg-type]
        job=section(JobSettings, cfg.job),
        launcher=section(LauncherSettings, cfg.launcher),
        watchdog=section(WatchdogSettings, cfg.trainer),
        one_process=kind is not None and kind.one_process,
        objective=str(cfg.objective) if "objective" in cfg else None,
    )
    script, layout = settings.script, settings.job.layout
    cwd = Path(str(script.cwd))
    key = attempt_key()
    attempt = attempt_number(run_dir, key)
    if ranks.is_main:
        attempts.begin(run_dir, fresh=False, resumed_from_step=None, key=key)
    resume = resumes(script, attempt, cwd)
    command, env = _command_and_env(settings, ranks, run_dir, attempt, resume)
    requeue_signal = signal_number(str(settings.launcher.signal))
    flag = StopFlag(requeue_signal, then="stopping the script")
    with handling(flag.stop_signals, flag.on_signal):  # the stop signals are the script's run's
        reads = _StartupReads()
        progress = _probes(_metrics_probe(run_dir), reads)
        beat = heartbeat.Heartbeat(run_dir, ranks, settings.watchdog, flag, probe=progress).start()
        how = ", resuming" if resume else ""
        log.info("rank %d (attempt %d%s): %s (in %s)", ranks.rank, attempt, how, " ".join(command), cwd)
        pattern = re.compile(str(script.objective_regex)) if script.objective_regex is not None else None
        try:
            proc = subprocess.Popen(
                command,
                cwd=cwd,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                preexec_fn=_ignore(requeue_signal),
            )
            beat.script_pid = reads.pid = proc.pid
            beat.mark(hang.RUNNING)
            out, err = _Tee(proc.stdout, sys.stdout, pattern), _Tee(proc.stderr, sys.stderr, pattern)
            out.start()
            err.start()
            _wait(proc, flag, script, ranks, attempt, run_dir, float(settings.launcher.signal_delay_s))
            out.join(timeout=5)
            err.join(timeout=5)
        finally:
            beat.close()
    if proc.returncode != 0:
        raise ScriptFailed(_failure(proc.returncode, ranks, command, err.tail))
    if not ranks.is_main:
        return None
    found = out.found or err.found
    return _finish(run_dir, attempt, command, int(layout.world_size), settings.objective, found)


def _command_and_env(
    settings: ScriptJobSettings, ranks: RankInfo, run_dir: Path, attempt: int, resume: bool
) -> Tuple[List[str], Dict[str, str]]:
    """The script's command line (under torchrun, or run directly) and its environment, threads shared among the
    processes the task starts."""
    script, layout = settings.script, settings.job.layout
    torchrun = script.launcher == "torchrun"
    mode = TORCHRUN if torchrun else ONE_PROCESS if settings.one_process else DIRECT
    if torchrun:
        endpoint = f"{ranks.master_addr}:{ranks.master_port}"
        run_id = os.environ.get("SLURM_JOB_ID") or os.environ.get(LAUNCH_ID_VARIABLE) or str(os.getppid())
        per_node = int(layout.gpus_per_node)
        nodes = int(layout.nodes)
        command = torchrun_command(asdict(script), sys.executable, resume, nodes, per_node, endpoint, run_id)
        threads = task_threads(layout, per_node)
    else:
        command = direct_command(asdict(script), sys.executable, resume)
        threads = task_threads(layout, 1)
    return command, script_env(ranks, run_dir, attempt, mode, threads, int(layout.nodes))


def _wait(
    proc: subprocess.Popen,
    flag: StopFlag,
    script: ScriptSettings,
    ranks: RankInfo,
    attempt: int,
    run_dir: Path,
    signal_delay_s: float,
) -> None:
    """Until the script exits; a stop signal stops it (after script.signal and its grace) and raises.

    Slurm's SIGTERM (``scancel``, ``scontrol requeue``, a preemption) reaches the script and this task alike: a
    script that died of it was stopped, not failed, even when it exits before this task looks at its flag.
    """
    while True:
        code = proc.poll()
        if code is not None and code < 0 and flag.request == NONE:
            time.sleep(2 * POLL_S)  # the same signal may be on its way to this task's handler
        if code is not None and (code == 0 or flag.request == NONE):
            return
        if flag.request == NONE:
            time.sleep(POLL_S)
            continue
        request = flag.request
        if request == REQUEUE and script.signal is not None:
            forwarded = signal_number(str(script.signal))
            log.info(
                "forwarding %s to the script; %s s to finish", signal.Signals(forwarded).name, script.signal_grace_s
            )
            proc.send_signal(forwarded)
            deadline = time.monotonic() + float(script.signal_grace_s)
            while proc.poll() is None and time.monotonic() < deadline and flag.request != TERMINATE:
                time.sleep(POLL_S)
        reason = flag.reason(request, signal_delay_s)
        if request == REQUEUE and flag.request == TERMINATE:
            # SIGTERM during the grace: the job is ending already. The script requeued it itself (Lightning's
            # SIGUSR1 handler runs `scontrol requeue` after its checkpoint), or it was cancelled or preempted:
            # requeueing it again would fail, or requeue it twice.
            request = TERMINATE
        step = _last_step(run_dir)
        if ranks.is_main:  # before stopping the script: after a SIGTERM, Slurm's SIGKILL may follow at any moment
            attempts.end(run_dir, attempt, reason, step)
        _stop(proc, signal.SIGTERM, STOP_GRACE_S)
        raise TrainingInterrupted(request, step, reason, flag, f"the script was stopped ({reason})")


def _metrics_probe(run_dir: Path) -> Any:
    """For the heartbeat, every beat: a grown metrics.jsonl (hpc_train.log_metrics) is progress, at its last step."""
    size = {"last": -1}

    def probe() -> None:
        try:
            now = (run_dir / rundir.METRICS).stat().st_size
        except OSError:
            return
        if now != size["last"]:
            if size["last"] >= 0:
                heartbeat.mark(hang.RUNNING, _last_step(run_dir), detail="it logged metrics")
                heartbeat.warmed_up()
            size["last"] = now

    return probe


class _StartupReads:
    """For the heartbeat, every beat until the script's first line: bytes read by the script (or a process it started)
    are progress.

    Until its first line a script says nothing, yet its start (the interpreter, ``import torch``, DDP's constructor
    importing torch._dynamo, its data and model) is slow work that reads file after file: 5-20 s on an idle 2-core
    VM, 35-75 s on a loaded one, where no rank went 6 s without reading. A start that hangs (a peer that never comes,
    a dead file system, a sleep, a spin) reads nothing and still ends as hung after the first-step allowance.
    """

    def __init__(self) -> None:
        self.pid: Optional[int] = None
        self.read: Dict[int, int] = {}

    def __call__(self) -> None:
        if self.pid is None or heartbeat.is_warm():
            return
        now = _bytes_read(self.pid)
        if any(count > self.read.get(pid, 0) for pid, count in now.items()):
            heartbeat.mark(hang.RUNNING)
        self.read = now


def _bytes_read(pid: int) -> Dict[int, int]:
    """Bytes read so far (``rchar``) by `pid` and every process below it (torchrun's ranks, data loader workers)."""
    tree = procfs.descendants(pid)
    read = {}
    for member in tree:
        try:
            with open(f"/proc/{member}/io") as handle:
                read[member] = next(int(line.split()[1]) for line in handle if line.startswith("rchar:"))
        except (OSError, ValueError, StopIteration):
            continue
    return read


def _probes(*probes: Any) -> Any:
    def probe() -> None:
        for each in probes:
            each()

    return probe


def _failure(code: int, ranks: RankInfo, command: List[str], tail: Deque[str]) -> str:
    where = f"rank {ranks.rank} ({socket.gethostname()}, pid {os.getpid()})"
    cause = death_cause(code)
    last = next((line for line in reversed(tail) if line.strip()), "")
    head = f"{where}: {' '.join(command[1:3])} {cause}" + (f"; its last line: {last.strip()}" if last else "")
    lines = "\n".join(f"    {line}" for line in tail)
    return head + (f"\nthe last lines of its stderr:\n{lines}" if lines else "")


def _last_step(run_dir: Path) -> int:
    rows = [r for r in rundir.read_jsonl(run_dir / rundir.METRICS) if isinstance(r.get("step"), int)]
    return int(rows[-1]["step"]) if rows else 0


def _finish(
    run_dir: Path, attempt: int, command: List[str], world_size: int, objective: Optional[str], found: Optional[str]
) -> Dict[str, Any]:
    """summary.json of a script job: the command, the attempts, the last metrics row's numbers, and what the script's
    output matched (`found`) as the `objective` key."""
    rows = [r for r in rundir.read_jsonl(run_dir / rundir.METRICS) if r.get("kind", "train") == "train"]
    last = rows[-1] if rows else {}
    summary: Dict[str, Any] = {
        "script": command[1:],
        "world_size": world_size,
        "global_step": last.get("step"),
        "attempts": attempt,
        "python": image_record(),
        **{
            f"train_{k}": v
            for k, v in last.items()
            if k not in ("kind", "step", "time") and isinstance(v, (int, float))
        },
    }
    if found is not None and objective is not None:
        try:
            summary[objective] = float(found)
        except ValueError:
            log.warning("script.objective_regex matched %r, which is not a number", found)
    attempts.end(run_dir, attempt, "finish", int(last.get("step") or 0))
    rundir.write_summary(run_dir, summary)
    return summary
