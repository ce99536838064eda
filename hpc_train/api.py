"""hpc_train's Python API: compose, run, submit and sweep jobs from Python, as `hpc-train` would.

``overrides`` are ``key=value`` strings exactly as on the command line; ``config_dir`` is what
``--config-dir`` is to the CLI (your own config groups, searched as the CLI searches them).

Decision: every job goes through the real CLI in a child process,
``python -m hpc_train.cli [--config-dir D] [-m] <overrides> hydra.run.dir=<run dir>``, rather than
calling the launcher in this process. Why:

* it is exactly what ``hpc-train`` does (composition, validation, layouts, launchers, sweeps,
  exit codes), with no second code path to drift;
* the launcher installs signal handlers, calls ``sys.exit`` and leaves Hydra's global state
  set; a notebook kernel or a user's script must not inherit any of that;
* the caller never imports torch (``import hpc_train`` stays login-node safe), and a local job's
  ranks are processes of their own either way.

The cost is one Python start per call (about a second). Only :func:`compose` works in this
process: it builds the config with Hydra's compose API over the search path the CLI uses. The
other functions compose first as well, which raises a composition error before any process
starts and tells them the launcher and the default run dir.

Errors: bad input raises :class:`ConfigError` with the message the CLI prints (composition
errors are translated in-process by ``hydra_errors.translate``; later ones, exit code 2 of the
CLI, are read back from what it printed). A job that fails raises :class:`JobFailed`, whose
``error`` is the one-line cause left by the rank that failed first (``logs/rank<r>.error.json``).

Run dirs: without ``run_dir`` (or a ``hydra.run.dir=`` override) a job gets the CLI's default,
``outputs/<date>/<time>`` under the current directory, made unique with a ``-1``, ``-2``...
suffix, because two calls in the same second would otherwise share a dir and the second would
resume the first's checkpoint. An explicit run dir is used as is (resume semantics, as with the
CLI). What the CLI prints goes to ``<run dir>/hpc-train.out`` (``<sweep dir>/hpc-train.out``).

Local sweeps run in one background ``hpc-train -m`` process, their jobs one after another as
the CLI runs them; each job's :class:`Job` watches ``<sweep dir>/<n>``. Slurm sweeps return
once every job is queued, their ids read from ``<sweep dir>/jobs.tsv``.
"""

from __future__ import annotations

import codecs
import contextlib
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Dict, Iterator, List, Optional, Sequence, Tuple, Union

from hpc_train import rundir
from hpc_train.launch.errors import ConfigError, JobFailed

if TYPE_CHECKING:
    from omegaconf import DictConfig

PathLike = Union[str, "os.PathLike[str]"]

OUTPUT_NAME = "hpc-train.out"  # what the CLI printed, in the run (or sweep) dir
EXIT_BAD_INPUT = rundir.EXIT_REFUSED  # the CLI's exit code for bad input: nothing ran
EXIT_STOPPED = rundir.EXIT_INTERRUPTED  # stopped by a signal after a checkpoint
ENDED = frozenset(
    {
        "COMPLETED",
        "FAILED",
        "CANCELLED",
        "TIMEOUT",
        "NODE_FAIL",
        "OUT_OF_MEMORY",
        "PREEMPTED",
        "BOOT_FAIL",
        "DEADLINE",
        "REVOKED",
    }
)
UNKNOWN_GRACE_S = 60.0  # a Slurm job neither squeue nor sacct knows for this long is gone
START_TIMEOUT_S = 120.0  # submit()/sweep() wait at most this long for a local job to start

__all__ = ["ConfigError", "Job", "JobFailed", "compose", "run", "staged_model", "submit", "sweep"]


# -- composing --------------------------------------------------------------------------------
def compose(overrides: Sequence[str] = (), config_dir: Optional[PathLike] = None) -> "DictConfig":
    """The job config `hpc-train <overrides>` would run, interpolations resolved; nothing runs.

    The same as ``hpc-train --cfg job --resolve``. Bad input raises ConfigError with the CLI's message.
    """
    cfg, _ = _compose(_checked(overrides), config_dir)
    return cfg


@contextlib.contextmanager
def _hydra(config_dir: Optional[PathLike]) -> Iterator[None]:
    """Hydra initialised as the CLI initialises it: the shipped conf/, then ``config_dir`` as --config-dir adds it.

    What ``hydra.initialize_config_dir`` does, plus the search-path entry Hydra adds for
    ``--config-dir`` (same provider, same place). Hydra's global state is restored on exit.
    """
    from hydra._internal.hydra import Hydra
    from hydra._internal.utils import create_config_search_path
    from hydra.core.config_search_path import SearchPathQuery
    from hydra.errors import SearchPathException
    from hydra.initialize import get_gh_backup, restore_gh_from_backup
    from hydra.version import setbase

    import hydra_plugins.hpc_train_launcher as plugin
    from hpc_train.conf import CONFIG_DIR

    plugin.register()
    setbase("1.3")
    search_path = create_config_search_path(CONFIG_DIR)
    if config_dir is not None:
        path = os.path.abspath(os.fspath(config_dir))
        if not os.path.isdir(path):
            raise SearchPathException(f"Additional config directory '{path}' not found")
        search_path.prepend(provider="command-line", path=f"file://{path}", anchor=SearchPathQuery(provider="schema"))
    backup = get_gh_backup()
    Hydra.create_main_hydra2(task_name="hpc-train", config_search_path=search_path)
    try:
        yield
    finally:
        restore_gh_from_backup(backup)


def _compose(overrides: List[str], config_dir: Optional[PathLike]) -> Tuple["DictConfig", Dict[str, str]]:
    """(resolved job config, {"run": run dir, "sweep": sweep dir} as Hydra would name them now)."""
    from hydra import compose as hydra_compose
    from hydra.core.hydra_config import HydraConfig
    from hydra.core.utils import setup_globals
    from omegaconf import OmegaConf, open_dict

    setup_globals()  # Hydra's resolvers (${now:...}, ${hydra:...}), as a @hydra.main app has them
    hydra_config = HydraConfig.instance()
    before = hydra_config.cfg
    try:
        with _hydra(config_dir):
            cfg = hydra_compose("config", overrides=list(overrides), return_hydra_config=True)
            hydra_config.set_config(cfg)  # ${hydra:...} in the job config resolves as in a run
            dirs = {"run": str(cfg.hydra.run.dir), "sweep": str(cfg.hydra.sweep.dir)}
            with open_dict(cfg):
                del cfg["hydra"]
            OmegaConf.resolve(cfg)
            return cfg, dirs
    except Exception as err:
        raise _as_config_error(err) from None
    finally:
        hydra_config.cfg = before


def _as_config_error(err: BaseException) -> BaseException:
    """The ConfigError the CLI would print for `err` (see hpc_train.cli._fail), else `err` itself."""
    from hydra.errors import CompactHydraException, HydraException

    from hpc_train.launch.hydra_errors import translate

    translated = translate(err)
    if translated is not None:
        return translated
    if isinstance(err, (CompactHydraException, HydraException)):  # Hydra's own words, as the CLI prints them
        cause = f"\n{err.__cause__}" if err.__cause__ is not None else ""
        return _CliWords(f"hpc-train: {err}{cause}")
    return err


class _CliWords(ConfigError):
    """Bad input the CLI reported in words of its own (Hydra's, or a rank's refusal): the message is that text."""

    def __init__(self, text: str) -> None:
        self._text = text.strip()
        key = re.search(r"`([^`]+)`", self._text)
        super().__init__(key.group(1) if key else "", self._text, "")

    @property
    def message(self) -> str:
        return self._text


def _checked(overrides: Sequence[str]) -> List[str]:
    if isinstance(overrides, (str, bytes)):
        raise TypeError(f"overrides must be a list of 'key=value' strings, not one string: [{overrides!r}]")
    checked = [str(o) for o in overrides]
    for override in checked:
        if override.startswith("-"):
            raise ConfigError(
                "overrides",
                f"{override!r} is a command-line flag, not an override.",
                "pass key=value overrides only; use config_dir=... for --config-dir, sweep() for -m, compose() for"
                " --cfg job.",
            )
    return checked


# -- running the CLI --------------------------------------------------------------------------
def _command(overrides: Sequence[str], config_dir: Optional[PathLike], multirun: bool = False) -> List[str]:
    command = [sys.executable, "-m", "hpc_train.cli"]
    if multirun:
        command.append("--multirun")
    if config_dir is not None:
        command += ["--config-dir", os.path.abspath(os.fspath(config_dir))]
    return command + list(overrides)


def _path_value(path: Path) -> str:
    """A path as an override value (quoted when Hydra's grammar would split or reinterpret it)."""
    text = str(path)
    if re.fullmatch(r"[\w/.\-+@~:]+", text):
        return text
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _own_dir(given: Optional[PathLike], overrides: Sequence[str], key: str, composed: str) -> Path:
    """Where the job writes: `given`, else the dir named by a `key=` override, else a fresh default dir."""
    if given is not None:
        return Path(given).resolve()
    composed_path = Path(composed).resolve()
    if any(o.split("=", 1)[0].lstrip("+") == key for o in overrides):
        return composed_path
    candidate, n = composed_path, 0
    while True:  # reserve a new dir: mkdir fails if another call (or process) took it first
        try:
            candidate.mkdir(parents=True)
            return candidate
        except FileExistsError:
            n += 1
            candidate = composed_path.with_name(f"{composed_path.name}-{n}")


def _pump(source: IO[bytes], sinks: List[IO[str]], keep: List[str]) -> None:
    """Copy a child's output as it comes (progress bars' carriage returns included)."""
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    for chunk in iter(lambda: source.read1(65536), b""):  # type: ignore[attr-defined]
        text = decoder.decode(chunk)
        keep.append(text)
        for sink in sinks:
            sink.write(text)
            sink.flush()
    source.close()


def _foreground(command: List[str], output: Path, echo: bool) -> Tuple[int, str, str]:
    """Run the CLI to its end: (exit code, stdout, stderr); both also go to `output` and, with echo, to ours."""
    output.parent.mkdir(parents=True, exist_ok=True)
    out: List[str] = []
    err: List[str] = []
    with output.open("w") as log:
        proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        pumps = [
            threading.Thread(target=_pump, args=(proc.stdout, [log, sys.stdout] if echo else [log], out), daemon=True),
            threading.Thread(target=_pump, args=(proc.stderr, [log, sys.stderr] if echo else [log], err), daemon=True),
        ]
        for pump in pumps:
            pump.start()
        try:
            code = proc.wait()
        except KeyboardInterrupt:  # what Ctrl-C does to hpc-train: local ranks stop, a queued Slurm job stays
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            raise
        finally:
            for pump in pumps:
                pump.join(timeout=10)
    return code, "".join(out), "".join(err)


def _background(command: List[str], output: Path) -> subprocess.Popen:
    """Start the CLI detached from our terminal (Ctrl-C here does not reach it), its output into `output`."""
    output.parent.mkdir(parents=True, exist_ok=True)
    with output.open("w") as log:
        return subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True
        )


def _bad_input(printed: str, run_dir: Optional[Path] = None, since: float = 0.0) -> ConfigError:
    """The ConfigError for a CLI that exited with code 2, from what it printed."""
    start = printed.rfind("hpc-train: invalid configuration for `")
    if start >= 0:
        text = printed[start:].strip()
        match = re.fullmatch(r"hpc-train: invalid configuration for `([^`]*)`: (.*?) Fix: (.*)", text, flags=re.S)
        if match:
            return ConfigError(match.group(1), match.group(2), match.group(3))
        return _CliWords(text)
    if run_dir is not None:
        _, error = _rank_error(run_dir, since)
        if error and error.startswith("Refusal: "):  # a rank refused to start: what it printed
            return _CliWords("hpc-train: " + error[len("Refusal: ") :])
    lines = printed.strip().splitlines()
    first = max((i for i, line in enumerate(lines) if line.startswith("hpc-train: ")), default=0)
    return _CliWords("\n".join(lines[first:]) or "hpc-train: bad input (exit code 2)")


def _rank_error(run_dir: Path, since: float) -> Tuple[Optional[int], Optional[str]]:
    """(rank, one-line error) of the rank that failed first, from logs/rank<r>.error.json written after `since`."""
    from hpc_train.rank_errors import read_records, root_cause

    log_dir = run_dir / rundir.LOGS
    ranks = [
        int(m.group(1))
        for m in (re.fullmatch(r"rank(\d+)\.error\.json", p.name) for p in log_dir.glob("rank*.error.json"))
        if m
    ]
    records = read_records(run_dir, max(ranks) + 1, since) if ranks else {}
    if not records:
        return None, None
    rank, record = root_cause([], records)
    return rank, str(record["error"]) if record else None


def _read_summary(run_dir: Path) -> Optional[Dict[str, Any]]:
    return rundir.read_summary(run_dir)


# -- jobs -------------------------------------------------------------------------------------
class Job:
    """A submitted job: local (a background hpc-train process) or Slurm (a job id).

    ``state()`` speaks Slurm's state names for both: PENDING, RUNNING, COMPLETED, FAILED,
    CANCELLED, TIMEOUT, ... A local job stopped by a signal after its checkpoint is CANCELLED
    (run the same overrides with the same run dir to resume it).
    """

    def __init__(
        self,
        job_id: str,
        run_dir: Path,
        launcher: str = "local",
        overrides: Sequence[str] = (),
        *,
        process: Optional[subprocess.Popen] = None,
        output: Optional[Path] = None,
        started: Optional[float] = None,
        next_run_dir: Optional[Path] = None,
        sweep_index: Optional[int] = None,
    ) -> None:
        self.job_id = str(job_id)
        self.run_dir = Path(run_dir)
        self.launcher = launcher
        self.overrides = list(overrides)
        self._process = process  # local: the hpc-train process running this job (shared by a local sweep's jobs)
        self._output = output  # what that process printed
        self._started = time.time() if started is None else started
        self._next_run_dir = next_run_dir  # local sweep: the next job's dir; once it starts, this job has ended
        self._sweep_index = sweep_index
        self._unknown_since: Optional[float] = None

    def __repr__(self) -> str:
        return f"Job(job_id={self.job_id!r}, run_dir={str(self.run_dir)!r}, launcher={self.launcher!r})"

    def summary(self) -> Optional[Dict[str, Any]]:
        """The job's summary.json as a dict, or None while there is none."""
        return _read_summary(self.run_dir)

    def state(self) -> str:
        if self.launcher == "slurm":
            return self._slurm_state()
        return self._local_state()

    def _slurm_state(self) -> str:
        from hpc_train.report import slurm_states

        state = slurm_states([self.job_id]).get(self.job_id)
        if state:
            return state
        # Between squeue forgetting a job and sacct recording it (or with no accounting at all).
        return "COMPLETED" if (self.run_dir / rundir.SUMMARY).exists() else "UNKNOWN"

    def _local_state(self) -> str:
        code = self._process.poll() if self._process is not None else None
        has_summary = (self.run_dir / rundir.SUMMARY).exists()
        if self._sweep_index is None:
            if self._process is not None and code is None:
                return "RUNNING"
            return _state_of_exit(code, has_summary)
        started = (self.run_dir / ".hydra").exists()
        ended = (self._process is None or code is not None) or (
            self._next_run_dir is not None and (self._next_run_dir / ".hydra").exists()
        )
        if not ended:
            return "RUNNING" if started else "PENDING"
        if has_summary:
            return "COMPLETED"
        return "CANCELLED" if _stopped(code) else "FAILED"

    def cancel(self) -> None:
        """Stop the job: ``scancel`` on Slurm; locally SIGTERM to hpc-train, whose ranks checkpoint and stop.

        The jobs of a local sweep share one process: cancelling one stops the sweep.
        """
        if self.launcher == "slurm":
            subprocess.run(["scancel", self.job_id], check=False, capture_output=True)
        elif self._process is not None and self._process.poll() is None:
            self._process.terminate()

    def wait(self, timeout: Optional[float] = None) -> Dict[str, Any]:
        """Block until the job ends; return its summary.

        Raises JobFailed when it did not complete, ConfigError when hpc-train refused its input,
        TimeoutError when it is still going after `timeout` seconds (the job keeps going).
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            state = self.state()
            if state in ENDED:
                break
            if state == "UNKNOWN":
                self._unknown_since = self._unknown_since or time.monotonic()
                if time.monotonic() - self._unknown_since > UNKNOWN_GRACE_S:
                    raise JobFailed(
                        f"Slurm job {self.job_id}: neither squeue nor sacct knows it any more, and it left no summary"
                        f" in {self.run_dir}",
                        error=self._error(),
                    )
            else:
                self._unknown_since = None
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(f"job {self.job_id} is still {state} after {timeout} s (run dir {self.run_dir})")
            pause = 1.0 if self.launcher == "slurm" else 0.2
            if deadline is not None:
                pause = max(0.0, min(pause, deadline - time.monotonic()))
            time.sleep(pause)
        return self._result(state)

    def _result(self, state: str) -> Dict[str, Any]:
        summary = self.summary()
        if state == "COMPLETED":
            if summary is not None:
                return summary
            if self.launcher != "slurm" and self._sweep_index is None:  # a dry run, or launcher=sbatch: nothing trained
                return {}
        code = self._process.poll() if self._process is not None else None
        if self.launcher != "slurm" and self._sweep_index is None and code == EXIT_BAD_INPUT:
            raise _bad_input(self._printed(), self.run_dir, self._started)
        rank, error = _rank_error(self.run_dir, self._started)
        cause = f": rank {rank} failed first ({error})" if error else ""
        where = (
            f"; its traceback: {rundir.rank_log(self.run_dir, rank)}"
            if error
            else f"; see {self.run_dir / rundir.LOGS}"
        )
        if state == "COMPLETED":
            cause = " without writing summary.json"
        printed = f" and {self._output}" if self._output is not None else ""
        raise JobFailed(
            f"job {self.job_id} {state}{cause}{where}{printed}",
            exit_code=code if code not in (None, 0) else 1,
            error=error,
        )

    def _error(self) -> Optional[str]:
        return _rank_error(self.run_dir, self._started)[1]

    def _printed(self) -> str:
        try:
            return self._output.read_text(errors="replace") if self._output is not None else ""
        except OSError:
            return ""


def _stopped(code: Optional[int]) -> bool:
    return code in (EXIT_STOPPED, 130, -signal.SIGINT, -signal.SIGTERM)


def _state_of_exit(code: Optional[int], has_summary: bool) -> str:
    if code == 0:
        return "COMPLETED"
    if code is None:
        return "COMPLETED" if has_summary else "UNKNOWN"
    return "CANCELLED" if _stopped(code) else "FAILED"


# -- run, submit, sweep -----------------------------------------------------------------------
def run(
    overrides: Sequence[str] = (),
    config_dir: Optional[PathLike] = None,
    run_dir: Optional[PathLike] = None,
    *,
    quiet: bool = False,
) -> Dict[str, Any]:
    """Run the job as `hpc-train <overrides>` would, wait for it, return its summary (summary.json).

    The launcher comes from the overrides (local by default); a Slurm job is followed to its
    end (``launcher.wait=true``). What hpc-train prints is shown here (``quiet=True``: only in
    ``<run dir>/hpc-train.out``). With ``dry_run=true`` nothing runs and the result is
    ``{"dry_run": True, "run_dir": ..., "output": <what was printed, e.g. the sbatch script>}``.
    Raises ConfigError for bad input, JobFailed when the job fails.
    """
    overrides = _checked(overrides)
    cfg, dirs = _compose(overrides, config_dir)
    target = _own_dir(run_dir, overrides, "hydra.run.dir", dirs["run"])
    launcher = str(cfg.launcher.name)
    extra = [f"hydra.run.dir={_path_value(target)}"] + (["launcher.wait=true"] if launcher == "slurm" else [])
    started = time.time()
    code, out, err = _foreground(_command(overrides, config_dir) + extra, target / OUTPUT_NAME, echo=not quiet)
    if code == EXIT_BAD_INPUT:
        raise _bad_input(err, target, started)
    summary = _read_summary(target)
    if code == 0 and summary is not None:
        return summary
    if code == 0 and (bool(cfg.dry_run) or launcher == "sbatch"):
        return {"dry_run": bool(cfg.dry_run), "run_dir": str(target), "output": out}
    rank, error = _rank_error(target, started)
    slurm_id = re.search(r"submitted Slurm job ([0-9_]+)", out)
    what = f"Slurm job {slurm_id.group(1)}" if slurm_id else "the job"
    cause = (
        f": rank {rank} failed first ({error})"
        if error
        else (" without writing summary.json" if code == 0 else f" (exit code {code})")
    )
    raise JobFailed(
        f"{what} in {target} failed{cause}; see {target / 'logs'} and {target / OUTPUT_NAME}",
        exit_code=code or 1,
        error=error,
    )


def submit(
    overrides: Sequence[str] = (), config_dir: Optional[PathLike] = None, run_dir: Optional[PathLike] = None
) -> Job:
    """Start the job and return at once: locally a background hpc-train process, on Slurm once it is queued.

    A local job returns as soon as it has passed validation and its ranks are starting (a few
    seconds); bad input raises ConfigError here. Its output goes to ``<run dir>/hpc-train.out``.
    """
    overrides = _checked(overrides)
    cfg, dirs = _compose(overrides, config_dir)
    target = _own_dir(run_dir, overrides, "hydra.run.dir", dirs["run"])
    command = _command(overrides, config_dir) + [f"hydra.run.dir={_path_value(target)}"]
    output = target / OUTPUT_NAME
    started = time.time()
    if str(cfg.launcher.name) == "slurm":
        code, out, err = _foreground(command + ["launcher.wait=false"], output, echo=False)
        if code == EXIT_BAD_INPUT:
            raise _bad_input(err)
        match = re.search(r"submitted Slurm job ([0-9_]+)", out)
        if code != 0 or match is None:
            raise JobFailed(f"hpc-train did not queue the job (exit code {code}); see {output}", exit_code=code or 1)
        return Job(match.group(1), target, "slurm", overrides, output=output, started=started)
    process = _background(command, output)
    _wait_for_start(process, [target / rundir.JOB_CONFIG], started)
    if process.poll() == EXIT_BAD_INPUT:
        raise _bad_input(output.read_text(errors="replace"), target, started)
    return Job(f"local-{process.pid}", target, "local", overrides, process=process, output=output, started=started)


def _wait_for_start(process: subprocess.Popen, marks: List[Path], since: float) -> None:
    """Until the process exits or one of `marks` is (re)written, so that refused input is seen here."""
    deadline = time.monotonic() + START_TIMEOUT_S
    while process.poll() is None and time.monotonic() < deadline:
        if any(_written_since(mark, since) for mark in marks):
            return
        time.sleep(0.1)


def _written_since(path: Path, since: float) -> bool:
    try:
        return path.stat().st_mtime >= since - 1.0
    except OSError:
        return False


def sweep(
    overrides: Sequence[str] = (), config_dir: Optional[PathLike] = None, sweep_dir: Optional[PathLike] = None
) -> List[Job]:
    """A multirun (`hpc-train -m <overrides>`): one Job per job of the sweep, in Hydra's job order.

    Slurm: returns once every job is queued (ids from ``<sweep dir>/jobs.tsv``). Local: the sweep
    runs in one background process, jobs one after another in ``<sweep dir>/<n>``; returns once
    the first job has started. All jobs must use the same launcher. With a sweeper that
    optimises (``hydra/sweeper=optuna``...), the number of jobs is not known in advance:
    sweep() then returns when the study has ended.
    """
    overrides = _checked(overrides)
    jobs = _expand(overrides)
    cfg, dirs = _compose(jobs[0], config_dir)
    target = _own_dir(sweep_dir, overrides, "hydra.sweep.dir", dirs["sweep"])
    launchers = {_launcher_of(job, str(cfg.launcher.name)) for job in jobs}
    if len(launchers) > 1:
        raise ConfigError(
            "launcher",
            f"this sweep mixes launchers ({', '.join(sorted(launchers))}); sweep() follows one kind of job.",
            "sweep the local and the Slurm jobs in two sweep() calls.",
        )
    launcher = launchers.pop()
    command = _command(overrides, config_dir, multirun=True) + [f"hydra.sweep.dir={_path_value(target)}"]
    output = target / OUTPUT_NAME
    started = time.time()
    optimising = any(
        o.split("=", 1)[0].lstrip("+") == "hydra/sweeper" and o.split("=", 1)[1] != "hpc_train" for o in overrides
    )
    if launcher == "slurm":
        known = _table_rows(target)
        code, _, err = _foreground(command, output, echo=False)
        if code == EXIT_BAD_INPUT:
            raise _bad_input(err)
        rows = _table_rows(target)[len(known) :]
        if code != 0 and not rows:
            raise JobFailed(f"hpc-train -m did not queue the sweep (exit code {code}); see {output}", exit_code=code)
        return [
            Job(
                row["job_id"],
                target / row["job"],
                "slurm",
                _overrides_of(target / row["job"], row["overrides"].split()),
                output=output,
                started=started,
            )
            for row in rows
        ]
    process = _background(command, output)
    if optimising:  # the sweeper decides how many jobs there are: wait for it
        process.wait()
        numbers = sorted(int(p.name) for p in target.iterdir() if p.name.isdigit() and (p / ".hydra").exists())
        jobs = [_overrides_of(target / str(n), []) for n in numbers]
    else:
        numbers = list(range(len(jobs)))
        _wait_for_start(process, [target / "0" / ".hydra" / "overrides.yaml"], started)
    if process.poll() == EXIT_BAD_INPUT and not any((target / str(n) / ".hydra").exists() for n in numbers):
        raise _bad_input(output.read_text(errors="replace"))
    return [
        Job(
            f"local-{process.pid}_{n}",
            target / str(n),
            "local",
            job,
            process=process,
            output=output,
            started=started,
            next_run_dir=target / str(n + 1),
            sweep_index=n,
        )
        for n, job in zip(numbers, jobs)
    ]


def _expand(overrides: List[str]) -> List[List[str]]:
    """Each job's overrides, in the order Hydra numbers the jobs (its basic sweeper's expansion)."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser

    try:
        parsed = OverridesParser.create().parse_overrides(overrides)
        if any(
            o.is_sweep_override() and not o.is_discrete_sweep() for o in parsed
        ):  # interval(), ...: for an optimising sweeper
            parsed = [o for o in parsed if not o.is_sweep_override() or o.is_discrete_sweep()]
        return [job for batch in BasicSweeper.split_arguments(parsed, None) for job in batch] or [[]]
    except Exception as err:
        raise _as_config_error(err) from None


def _overrides_of(run_dir: Path, fallback: List[str]) -> List[str]:
    """A sweep job's overrides as Hydra recorded them (.hydra/overrides.yaml), else `fallback`."""
    import yaml

    try:
        listed = yaml.safe_load((run_dir / ".hydra" / "overrides.yaml").read_text())
    except (OSError, yaml.YAMLError):
        return fallback
    return [str(o) for o in listed] if isinstance(listed, list) else fallback


def _launcher_of(job: List[str], default: str) -> str:
    for override in job:
        key, _, value = override.partition("=")
        if key.lstrip("+") == "launcher":
            return value
    return default


def _table_rows(sweep_dir: Path) -> List[Dict[str, str]]:
    """The rows of the sweep's jobs.tsv (job_id, job, overrides, layout), header lines skipped."""
    try:
        lines = (sweep_dir / rundir.JOB_TABLE).read_text().splitlines()
    except OSError:
        return []
    header = ["job_id", "job", "overrides", "layout"]
    return [dict(zip(header, line.split("\t"))) for line in lines if line and not line.startswith("job_id\t")]


# -- in-process staging -----------------------------------------------------------------------
def staged_model(
    model: Any,
    devices: Optional[Sequence[Any]] = None,
    stages: Optional[int] = None,
    chunks: int = 1,
    balance: Union[str, Sequence[int]] = "params",
    split_points: Optional[Sequence[str]] = None,
    batchnorm: str = "keep",
    example: Any = None,
) -> Any:
    """`model` cut into consecutive stages exactly as ``strategy=model_parallel`` (chunks=1) or ``pipeline`` builds it.

    For timing or inspecting a split in this process (the demo notebook does). Arguments
    mirror the strategy's keys: ``stages`` (default: one per device, or ``len(split_points) + 1``),
    ``chunks`` (micro-batches per batch), ``balance`` (``params``, ``time`` with an ``example``
    batch, or layer counts), ``split_points`` (module names where a stage begins) and
    ``batchnorm`` (``keep`` or ``freeze``). ``devices``: torch devices or names, stage s on
    ``devices[s % len(devices)]``; default: the visible GPUs (wrapping around when there are
    fewer than stages), else the CPU, as a training task would place them. Returns an
    ``nn.Module`` with ``.stages``, ``.devices``, ``.output_device``; feed it inputs on
    ``devices[0]``. Imports torch: not for the login node.
    """
    import torch

    from hpc_train.compute.stages import build_staged

    points = [str(p) for p in split_points or []]
    if points and stages is not None and stages != len(points) + 1:
        raise ValueError(f"stages={stages} disagrees with split_points={points} ({len(points) + 1} stages)")
    if devices is None:
        wanted = stages or (len(points) + 1 if points else max(1, torch.cuda.device_count()))
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        devices = [torch.device("cuda", i % count) for i in range(wanted)] if count else [torch.device("cpu")] * wanted
    devices = [torch.device(d) for d in devices]
    stages = stages or (len(points) + 1 if points else len(devices))
    balance = balance if isinstance(balance, str) else [int(b) for b in balance]
    return build_staged(
        model,
        devices,
        stages,
        balance,
        chunks,
        freeze_batchnorm=batchnorm == "freeze",
        example=example,
        split_points=points or None,
    )
