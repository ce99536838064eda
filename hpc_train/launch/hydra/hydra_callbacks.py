"""Checks that need the whole Hydra config, before Hydra starts anything; a single run's own run dir.

Registered in conf/config.yaml under ``hydra.callbacks``; Hydra calls ``on_multirun_start``
after composing the sweep's config and before it builds the sweeper and the launcher, and
``on_run_start`` before a single run's Hydra writes its files into the run dir. There a run dir named by the
clock (``${now:...}``, the default ``outputs/<date>/<time>``) is made for this command alone (``-1``, ``-2``, ...
when another command took that second), and ``tidy_run_dir`` removes it again after a dry run or a refusal that
left nothing but Hydra's own files in it. A run dir that was there (a finished run's, a resume's) is read as found
first (:class:`FoundRunDir`), and a refused command puts Hydra's files there back as they were: its ``.hydra/``
and the job's log describe the run that ran, not the command that was refused.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf, read_write

from hpc_train.config.errors import ConfigError
from hpc_train.config.launcher import APP_LAUNCHERS, LAUNCHERS
from hpc_train.errors import HpcTrainError
from hpc_train.launch.backends.local import torchrun as torchrun_client
from hpc_train.launch.hydra import exits
from hpc_train.launch.planning.objective import check_objective
from hpc_train.records import as_found, run_claim

# Launchers that would wrap hpc-train's own launcher in one more Slurm job of a fixed shape.
REFUSED_LAUNCHERS = {
    "hydra_plugins.hydra_submitit_launcher.submitit_launcher.SlurmLauncher": "submitit_slurm",
    "hydra_plugins.hydra_submitit_launcher.submitit_launcher.LocalLauncher": "submitit_local",
    # hpc_train's own launchers for other Hydra apps (hpc_train.launch.hydra.app_launcher): the same trap
    **{kind.target: kind.name for kind in APP_LAUNCHERS.values()},
}


class Refused(BaseException):
    """A ConfigError (or a run dir refused: RunDirBusy) raised from a callback.

    Hydra turns an Exception raised in a callback into a warning and carries on; a
    BaseException passes through to hpc_train.cli.main, which prints the error.
    """

    def __init__(self, error: HpcTrainError) -> None:
        super().__init__(str(error))
        self.error = error


@dataclass
class MadeRunDir:
    """The run dir this command made (not one that was there before), and what it was made for."""

    path: Path
    top: Path  # the highest folder made for it (its dated parent when that was new too)
    hydra_files: frozenset  # what Hydra itself writes there: .hydra/ and the job's log
    dry_run: bool


@dataclass
class FoundRunDir:
    """Hydra's files in a run dir that was there, as this command found them (before Hydra writes .hydra/ and opens
    the job's log), to be put back after a refusal: each .hydra/ file's bytes and times (None: absent), the log's
    size and times (None: absent; only a refused command's lines are cut, never the run's)."""

    folder: Path
    hydra_files: as_found.FilesAsFound
    log: as_found.LogAsFound

    @classmethod
    def take(cls, run_dir: Path, subdir: Optional[str], log_name: str) -> "FoundRunDir":
        folder = run_dir / (subdir or ".hydra")
        names = {*(p.name for p in folder.glob("*.yaml")), *HYDRA_RECORDS}
        files = as_found.FilesAsFound.take(folder / name for name in names)
        return cls(folder, files, as_found.LogAsFound.take(run_dir / log_name))

    def put_back(self) -> None:
        self.hydra_files.put_back()
        if self.hydra_files.absent():
            as_found.remove_empty(self.folder)
        self.log.cut_back()


HYDRA_RECORDS = ("config.yaml", "hydra.yaml", "overrides.yaml")  # what Hydra's run_job writes into .hydra/


_MADE: Optional[MadeRunDir] = None  # this process's single run, from on_run_start to tidy_run_dir
_FOUND: Optional[FoundRunDir] = None  # or the run dir it found there, from on_run_start to tidy_run_dir


class LaunchGuard(Callback):
    """Refuse launcher choices that cannot work and dry runs a sweeper cannot optimise; give a run its own dir."""

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        """A run dir of its own made; a run dir that a live job holds refused before Hydra writes .hydra/ and its log
        into it; a dry run's Hydra writes no .hydra/ (into a run dir of a real run, say)."""
        if torchrun_client.active():  # every rank starts here, and rank 0 claims the run dir for all of them
            return
        try:
            run_dir = Path(str(OmegaConf.select(config, "hydra.run.dir")))
        except Exception:  # an interpolation Hydra resolves later (the job's own output dir): run_job checks it
            return
        run_dir = _own_run_dir(config, run_dir)
        kind = LAUNCHERS.get(str(OmegaConf.select(config, "launcher.name", default=None)))
        if config.get("dry_run"):
            with read_write(config.hydra):
                config.hydra.output_subdir = None
        # a bad name is refused with the other keys; a plain sbatch script's step claims nothing
        if not (config.get("dry_run") or kind is None or kind.prepares_only):
            try:
                run_claim.check_free(run_dir)
            except run_claim.RunDirBusy as busy:
                raise Refused(busy) from None
        _find_run_dir(config, run_dir)  # after the check: a live run's files are never read as found and put back

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        try:
            self._check(config)
        except ConfigError as err:
            raise Refused(err) from None

    @staticmethod
    def _check(config: DictConfig) -> None:
        target = str(OmegaConf.select(config, "hydra.launcher._target_", default="") or "")
        if target in REFUSED_LAUNCHERS:
            name = REFUSED_LAUNCHERS[target]
            raise ConfigError(
                "hydra/launcher",
                f"hydra/launcher={name} would give every job of the sweep the one sbatch shape of hydra.launcher and"
                " run hpc-train's local launcher inside it, ignoring each job's strategy layout.",
                "keep hydra/launcher=hpc_train (the default) and pass launcher=slurm: it submits every job through"
                " submitit with its own layout.",
            )
        check_objective(config, config.hydra)


def _own_run_dir(config: DictConfig, run_dir: Path) -> Path:
    """Make the run dir now when it is new (remembered for tidy_run_dir); a dir named by the clock that another
    command took in the same second becomes ``<name>-1`` (then ``-2``, ...), written back into the config."""
    global _MADE
    named_by_clock = "${now:" in str(OmegaConf.to_container(config.hydra.run, resolve=False).get("dir"))
    top = as_found.highest_missing(run_dir)
    if top is None and not named_by_clock:
        return run_dir  # a dir the user named, there already: a resume, a rerun; it stays as it is
    try:
        made = as_found.fresh_dir(run_dir) if named_by_clock else _mkdir(run_dir)
    except FileExistsError:  # another command made the user's dir just now: it is theirs
        return run_dir
    if made != run_dir:
        with read_write(config.hydra):
            config.hydra.run.dir = str(made)
    log = f"{OmegaConf.select(config, 'hydra.job.name', default='')}.log"
    _MADE = MadeRunDir(made, top or made, frozenset({".hydra", log}), bool(config.get("dry_run")))
    return made


def _find_run_dir(config: DictConfig, run_dir: Path) -> None:
    """A run dir this command did not make (a dry run writes nothing there): Hydra's files in it as found."""
    global _FOUND
    if config.get("dry_run") or (_MADE is not None and _MADE.path == run_dir) or not run_dir.is_dir():
        return
    subdir = OmegaConf.select(config, "hydra.output_subdir", default=None)
    log = f"{OmegaConf.select(config, 'hydra.job.name', default='')}.log"
    _FOUND = FoundRunDir.take(run_dir, None if subdir is None else str(subdir), log)


def _mkdir(path: Path) -> Path:
    path.mkdir(parents=True)
    return path


def tidy_run_dir(exit_code: object) -> None:
    """After the command: the run dir it made is removed again when the command was a dry run, or was refused (exit
    code 2, or 5: exits.REFUSED) before anything but Hydra's own files was written there; so is the dated folder
    made for it, if empty.
    A refused command's Hydra files in a run dir that was there are put back as they were found."""
    if _FOUND is not None and exit_code in exits.REFUSED:
        _FOUND.put_back()
    made = _MADE
    if made is None or not made.path.is_dir():
        return
    refused = exit_code in exits.REFUSED and {p.name for p in made.path.iterdir()} <= made.hydra_files
    if not (made.dry_run or refused):
        return
    as_found.remove_made(made.path, made.top)
