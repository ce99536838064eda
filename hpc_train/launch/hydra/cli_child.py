"""The public API's plumbing: the real `hpc-train` CLI run in a child process, and what it printed read back.

``hpc_train.api`` shows the calls users make; this module holds how they are carried out:
Hydra initialised as the CLI initialises it (for ``compose``), the command line, the child's
output pumped to a file (and the terminal), waiting for a job to start, turning the CLI's
refusal (exit code 2, or 5: the cluster unreachable) back into its family of hpc_train.errors (``exits``), and
reading a sweep's ``jobs.tsv``.
"""

from __future__ import annotations

import codecs
import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Dict, Iterator, List, Optional, Sequence, Tuple, Union

import yaml

from hpc_train.conf import CONFIG_DIR
from hpc_train.config.errors import ConfigError
from hpc_train.errors import HpcTrainError
from hpc_train.jobs.job_states import first_rank_error
from hpc_train.launch.hydra import exits, hydra_internals
from hpc_train.launch.hydra.exits import CliWords
from hpc_train.records import as_found, rundir
from hpc_train.records.rank_errors import refusal_words

if TYPE_CHECKING:
    from omegaconf import DictConfig

PathLike = Union[str, "os.PathLike[str]"]
OUTPUT_NAME = "hpc-train.out"  # what the CLI printed, in the run (or sweep) dir
RESULT_NAME = "hpc-train.result.json"  # beside it: the CLI's refusal as data (key, problem, fix), for the API
CLI_MODULE = "hpc_train.cli"  # the child: python -m CLI_MODULE
# What Hydra writes into a run dir before the job starts: its .hydra/ and the job's log, named after the module
HYDRA_FILES = frozenset({Path(rundir.HYDRA_OVERRIDES).parent.name, CLI_MODULE.rsplit(".", 1)[-1] + ".log"})
START_TIMEOUT_S = 120.0  # submit()/sweep() wait at most this long for a local job to start


@contextlib.contextmanager
def hydra_initialized(config_dir: Optional[PathLike]) -> Iterator[None]:
    """Hydra initialised as the CLI initialises it: the shipped conf/, then ``config_dir`` as --config-dir adds it.

    What ``hydra.initialize_config_dir`` does, plus the search-path entry Hydra adds for
    ``--config-dir`` (same provider, same place). Hydra's global state is restored on exit. hpc_train's Hydra
    plugin (its launchers and sweeper in Hydra's ConfigStore) must be loaded first: the Python API registers it
    (``hpc_train.api``); inside a Hydra app whose launcher is hpc_train's, Hydra has loaded it already.
    """
    # Hydra (~0.2 s) on use: hpc_train.api and hpc-train-report --watch import this module without composing
    from hydra.core.config_search_path import SearchPathQuery
    from hydra.errors import SearchPathException
    from hydra.version import VersionBase, setbase

    base = VersionBase.instance().getbase()  # a process-wide singleton: the caller's Hydra app keeps its own
    setbase("1.3")
    search_path = hydra_internals.config_search_path(CONFIG_DIR)
    if config_dir is not None:
        path = os.path.abspath(os.fspath(config_dir))
        if not os.path.isdir(path):
            raise SearchPathException(f"Additional config directory '{path}' not found")
        search_path.prepend(provider="command-line", path=f"file://{path}", anchor=SearchPathQuery(provider="schema"))
    backup = hydra_internals.global_hydra_backup()
    hydra_internals.create_main_hydra("hpc-train", search_path)
    try:
        yield
    finally:
        hydra_internals.restore_global_hydra(backup)
        VersionBase.instance().version_base = base  # hydra.version has no public way back to "unspecified"


def compose(overrides: List[str], config_dir: Optional[PathLike]) -> Tuple["DictConfig", Dict[str, str]]:
    """(resolved job config, {"run": run dir, "sweep": sweep dir} as Hydra would name them now)."""
    # Hydra (~0.2 s) on use: hpc_train.api and hpc-train-report --watch import this module without composing
    from hydra import compose as hydra_compose
    from hydra.core.hydra_config import HydraConfig
    from hydra.core.utils import setup_globals
    from omegaconf import OmegaConf, open_dict

    from hpc_train.config.engine import whole_mappings  # the key table (OmegaConf): only when composing

    setup_globals()  # Hydra's resolvers (${now:...}, ${hydra:...}), as a @hydra.main app has them
    hydra_config = HydraConfig.instance()
    before = hydra_config.cfg
    try:
        with hydra_initialized(config_dir):
            cfg = hydra_compose("config", overrides=whole_mappings(overrides), return_hydra_config=True)
            hydra_config.set_config(cfg)  # ${hydra:...} in the job config resolves as in a run
            dirs = {"run": str(cfg.hydra.run.dir), "sweep": str(cfg.hydra.sweep.dir)}
            with open_dict(cfg):
                del cfg["hydra"]
            OmegaConf.resolve(cfg)
            return cfg, dirs
    except Exception as err:
        raise as_config_error(err) from None
    finally:
        hydra_config.cfg = before


def as_config_error(err: BaseException) -> BaseException:
    """The ConfigError the CLI would print for `err` (see hpc_train.cli._fail), else `err` itself."""
    # Hydra (~0.2 s), also through hydra_errors: only after composing or expanding has failed
    from hydra.errors import CompactHydraException, HydraException

    from hpc_train.launch.hydra.hydra_errors import translate

    translated = translate(err)
    if translated is not None:
        return translated
    if isinstance(err, (CompactHydraException, HydraException)):  # Hydra's own words, as the CLI prints them
        cause = f"\n{err.__cause__}" if err.__cause__ is not None else ""
        return CliWords(f"hpc-train: {err}{cause}")
    return err


def checked(overrides: Sequence[str]) -> List[str]:
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


def cli_command(overrides: Sequence[str], config_dir: Optional[PathLike], multirun: bool = False) -> List[str]:
    command = [sys.executable, "-m", CLI_MODULE]
    if multirun:
        command.append("--multirun")
    if config_dir is not None:
        command += ["--config-dir", os.path.abspath(os.fspath(config_dir))]
    return command + list(overrides)


def path_value(path: Path) -> str:
    """A path as an override value (quoted when Hydra's grammar would split or reinterpret it)."""
    text = str(path)
    if re.fullmatch(r"[\w/.\-+@~:]+", text):
        return text
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def own_dir(given: Optional[PathLike], overrides: Sequence[str], key: str, composed: str) -> Path:
    """Where the job writes: `given`, else the dir named by a `key=` override, else a fresh default dir."""
    if given is not None:
        return Path(given).resolve()
    composed_path = Path(composed).resolve()
    if _named(overrides, key):
        return composed_path
    return as_found.fresh_dir(composed_path)


def _named(overrides: Sequence[str], key: str) -> bool:
    return any(o.split("=", 1)[0].lstrip("+") == key for o in overrides)


@dataclass
class OwnDir:
    """A call's dir (own_dir) and the highest folder made for it by this call: None when the dir was there."""

    path: Path
    made: Optional[Path]

    def remove(self) -> None:
        """The dir this call made removed again, with the folders made for it when empty: a dry run leaves nothing
        behind."""
        as_found.remove_made(self.path, self.made)

    @contextlib.contextmanager
    def output(self, dry_run: bool) -> Iterator[Path]:
        """The file for what the call's CLI prints (and its refusal as data, beside it): ``<dir>/hpc-train.out``. A dry
        run's goes to a temporary folder, and the dir this call made is removed when the call ends: a dry run leaves
        nothing behind and touches no file of a dir that was there (an earlier run's hpc-train.out)."""
        if not dry_run and self.made is not None:
            yield self.path / OUTPUT_NAME
            return
        if not dry_run:
            with self._found_dir_output() as output:
                yield output
            return
        try:
            with tempfile.TemporaryDirectory(prefix="hpc-train-dry-run-") as folder:
                yield Path(folder) / OUTPUT_NAME
        finally:
            self.remove()

    @contextlib.contextmanager
    def _found_dir_output(self) -> Iterator[Path]:
        """In a dir that was there (a finished run's), the call's output and refusal go to a hidden folder of the
        call's own in it; once the call is not refused, its output replaces ``<dir>/hpc-train.out`` (the same file:
        a background job's output goes on in it), and a refusal (exits.REFUSALS) leaves the dir's files as they were."""
        folder = Path(tempfile.mkdtemp(prefix=".hpc-train-call-", dir=self.path))
        try:
            yield folder / OUTPUT_NAME
        except exits.REFUSALS:
            raise
        except BaseException:
            _move(folder / OUTPUT_NAME, self.path / OUTPUT_NAME)
            raise
        else:
            _move(folder / OUTPUT_NAME, self.path / OUTPUT_NAME)
        finally:
            shutil.rmtree(folder, ignore_errors=True)

    def refused(self, error: HpcTrainError) -> HpcTrainError:
        """`error`, after the CLI refused the call (exits.REFUSED) with it as data: the dir this call made is removed
        when nothing but the call's output, the refusal and Hydra's own files is in it (the error says what was
        printed); a dir with more (a rank's logs), or one that was there, stays."""
        names = {p.name for p in self.path.iterdir()} if self.path.is_dir() else set()
        if RESULT_NAME in names and names <= {OUTPUT_NAME, RESULT_NAME, *HYDRA_FILES}:
            self.remove()
        return error


def _move(source: Path, target: Path) -> None:
    if source.exists():
        rundir.replace_atomic(source, target)


def reserve(given: Optional[PathLike], overrides: Sequence[str], key: str, composed: str) -> OwnDir:
    """own_dir, remembering whether this call makes it (it or the CLI, and the call's output in it) or found it."""
    wanted = Path(given if given is not None else composed).resolve()
    top = as_found.highest_missing(wanted)
    path = own_dir(given, overrides, key, composed)
    return OwnDir(path, top if path == wanted else path)  # else fresh_dir made <name>-1 (-2, ...) for this call


def pump_output(source: IO[bytes], sinks: List[IO[str]], keep: List[str]) -> None:
    """Copy a child's output as it comes (progress bars' carriage returns included)."""
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    for chunk in iter(lambda: source.read1(65536), b""):  # type: ignore[attr-defined]
        text = decoder.decode(chunk)
        keep.append(text)
        for sink in sinks:
            sink.write(text)
            sink.flush()
    source.close()


def write_result(error: BaseException) -> None:
    """The child CLI's side: its refusal (exits.REFUSED) as data, into the file the API named (nothing otherwise)."""
    path = os.environ.get(rundir.CLI_RESULT_VARIABLE)
    if not path:
        return
    data = exits.as_data(error)
    try:
        rundir.write_text_atomic(Path(path), json.dumps(data), make_folder=False)
    except FileNotFoundError:  # the call that named it has returned (a started job's later refusal): said on the
        pass  # terminal and in the rank's records, which the API reads then


def result_path(output: Path) -> Path:
    """The file the child CLI writes its refusal into: beside what it printed."""
    return output.with_name(RESULT_NAME)


def _child_env(output: Path) -> Dict[str, str]:
    """The child's environment: ours, and where to write its refusal (an old one removed first)."""
    result_path(output).unlink(missing_ok=True)
    return {**os.environ, rundir.CLI_RESULT_VARIABLE: str(result_path(output))}


def foreground(command: List[str], output: Path, echo: bool) -> Tuple[int, str, str]:
    """Run the CLI to its end: (exit code, stdout, stderr); both also go to `output` and, with echo, to ours."""
    output.parent.mkdir(parents=True, exist_ok=True)
    out: List[str] = []
    err: List[str] = []
    env = _child_env(output)
    with output.open("w") as log:
        proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
        pumps = [
            threading.Thread(
                target=pump_output, args=(proc.stdout, [log, sys.stdout] if echo else [log], out), daemon=True
            ),
            threading.Thread(
                target=pump_output, args=(proc.stderr, [log, sys.stderr] if echo else [log], err), daemon=True
            ),
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


def background(
    command: List[str], output: Path, env: Optional[Dict[str, str]] = None, append: bool = False
) -> subprocess.Popen:
    """Start the CLI detached from our terminal (a session of its own: Ctrl-C and a closed terminal do not reach it,
    stdin closed), its output into `output` (after what it held, with `append`), `env` added to ours."""
    output.parent.mkdir(parents=True, exist_ok=True)
    env = {**_child_env(output), **(env or {})}
    with output.open("a" if append else "w") as log:
        return subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True, env=env
        )


def bad_input(output: Path, run_dir: Optional[Path] = None, since: float = 0.0) -> HpcTrainError:
    """The error of a CLI that refused (exits.REFUSED), of its family (a ConfigError for bad input), from the refusal
    it wrote as data beside its output `output` (``write_result``), else from a rank's refusal record in `run_dir`;
    never from printed words."""
    try:
        data = json.loads(result_path(output).read_text())
    except (OSError, ValueError):
        data = None
    if isinstance(data, dict) and ("problem" in data or "words" in data):
        return exits.from_data(data)
    if run_dir is not None:
        refused = refusal_words(first_rank_error(run_dir, since)[1])
        if refused:  # a rank refused: what it printed
            return CliWords("hpc-train: " + refused)
    return CliWords(f"hpc-train: the input was refused (exit code 2); what it printed: {output}")


def wait_for_start(process: subprocess.Popen, marks: List[Path], since: float) -> None:
    """Until the process exits or one of `marks` is (re)written, so that refused input is seen here."""
    deadline = time.monotonic() + START_TIMEOUT_S
    while process.poll() is None and time.monotonic() < deadline:
        if any(written_since(mark, since) for mark in marks):
            return
        time.sleep(0.1)


def written_since(path: Path, since: float) -> bool:
    try:
        return path.stat().st_mtime >= since - 1.0
    except OSError:
        return False


def expand(overrides: List[str]) -> List[List[str]]:
    """Each job's overrides, in the order Hydra numbers the jobs (its basic sweeper's expansion)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser  # Hydra (~0.2 s): only to expand a sweep

    try:
        parsed = OverridesParser.create().parse_overrides(overrides)
        if any(
            o.is_sweep_override() and not o.is_discrete_sweep() for o in parsed
        ):  # interval(), ...: for an optimising sweeper
            parsed = [o for o in parsed if not o.is_sweep_override() or o.is_discrete_sweep()]
        return [
            job for batch in hydra_internals.basic_sweeper_class().split_arguments(parsed, None) for job in batch
        ] or [[]]
    except Exception as err:
        raise as_config_error(err) from None


def overrides_of(run_dir: Path, fallback: List[str]) -> List[str]:
    """A sweep job's overrides as Hydra recorded them (.hydra/overrides.yaml), else `fallback`."""
    try:
        listed = yaml.safe_load((run_dir / ".hydra" / "overrides.yaml").read_text())
    except (OSError, yaml.YAMLError):
        return fallback
    return [str(o) for o in listed] if isinstance(listed, list) else fallback


def launcher_of(job: List[str], default: str) -> str:
    for override in job:
        key, _, value = override.partition("=")
        if key.lstrip("+") == "launcher":
            return value
    return default
