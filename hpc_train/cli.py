"""The `hpc-train` command: a Hydra app over conf/ (login-node safe: no torch import).

Hydra decides what the command line means: every Hydra flag (``--cfg``, ``--info``,
``--config-dir``, ``-m``, ``-sc``, ...), the user's config dirs, ``hydra/`` groups and sweeper
plugins work as in any Hydra app. Hydra's errors are let through to :func:`main` (by setting
Hydra's own ``HYDRA_FULL_ERROR`` for this process) and reworded there into one paragraph
naming the key and the fix; nothing is checked ahead of Hydra.
"""

from __future__ import annotations

import gc

# This module is the `hpc-train` command's entry point (the Python API does not import it): a
# short-lived process that mostly imports (Hydra, OmegaConf, submitit). With Python's default
# thresholds the garbage collector walks those modules' objects ~120 times, ~40 ms of a dry run's
# ~0.5 s CPU on a login node, and frees next to nothing. A larger first threshold keeps collection
# for what really allocates (as mypy does); a process that goes on to train (a torchrun rank)
# gets Python's thresholds back first.
PYTHON_GC_THRESHOLDS = gc.get_threshold()
gc.set_threshold(100_000, 50, 100)

import os  # noqa: E402
import sys  # noqa: E402
import traceback  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import NoReturn, Optional  # noqa: E402

import hydra  # noqa: E402
from hydra.core.hydra_config import HydraConfig  # noqa: E402
from hydra.errors import CompactHydraException, HydraException  # noqa: E402
from omegaconf import DictConfig  # noqa: E402
from omegaconf.errors import OmegaConfBaseException  # noqa: E402

import hydra_plugins.hpc_train_launcher  # noqa: E402
from hpc_train.conf import CONFIG_DIR  # noqa: E402
from hpc_train.config.engine import checked_view, whole_mappings  # noqa: E402
from hpc_train.errors import HpcTrainError, JobFailed  # noqa: E402
from hpc_train.launch.backends.local import torchrun as torchrun_client  # noqa: E402
from hpc_train.launch.backends.local.torchrun import rank_argv  # noqa: E402
from hpc_train.launch.backends.registry import run_configured  # noqa: E402
from hpc_train.launch.hydra import exits, forwarding  # noqa: E402
from hpc_train.launch.hydra.cli_child import CliWords, write_result  # noqa: E402
from hpc_train.launch.hydra.hydra_callbacks import Refused, tidy_run_dir  # noqa: E402
from hpc_train.launch.hydra.hydra_errors import from_omegaconf, translate  # noqa: E402
from hpc_train.launch.planning import auto_layout, objective  # noqa: E402
from hpc_train.launch.planning.errors import Forwarded, Interrupted  # noqa: E402
from hpc_train.processes.script_command import split_command_line  # noqa: E402
from hpc_train.records.rundir import EXIT_CTRL_C  # noqa: E402
from hpc_train.records.rundir import EXIT_REFUSED as EXIT_BAD_INPUT  # noqa: E402


def _task(cfg: DictConfig) -> Optional[float]:
    """Hydra's task function: run or submit one job; returns its objective when a sweeper optimises.

    In a sweep, hpc_train's errors (bad input, a failed job, ...) are raised, so Hydra marks that job FAILED and the
    sweeper decides (Optuna's max_failure_rate); a single run prints the message and exits.
    """
    hydra_cfg = HydraConfig.get()
    try:
        return _run_one(cfg, Path(hydra_cfg.runtime.output_dir), objective.sweeper_wants_objective(hydra_cfg))
    except HpcTrainError as err:
        if str(getattr(hydra_cfg.mode, "name", hydra_cfg.mode)) == "MULTIRUN":
            raise
        _fail(err, user_wants_traceback=False)
    except Forwarded as forwarded:  # exits here: an exception would make Hydra print its own line
        _exit_forwarded(forwarded)


def _run_one(cfg: DictConfig, run_dir: Path, wants_objective: bool) -> Optional[float]:
    try:
        objective.check_objective(cfg, HydraConfig.get())
        if forwarding.wanted(cfg) and not torchrun_client.active():  # cluster.login: the cluster submits it
            _forward_or_note(cfg, run_dir)
        if torchrun_client.active():  # started by torchrun: this process is one rank of torchrun's world
            gc.set_threshold(*PYTHON_GC_THRESHOLDS)
            code = torchrun_client.run_rank(cfg, run_dir)
        else:  # the launcher's backend: here, queued on Slurm, or a plain sbatch script's first step
            code = run_configured(cfg, run_dir, wait=wants_objective)
    except OmegaConfBaseException as err:  # a key our checks read is missing or unresolvable (e.g. ~trainer.lr)
        translated = from_omegaconf(err)
        if translated is None:
            raise
        raise translated from None
    if code != 0:
        raise JobFailed(
            f"the job in {run_dir} failed (exit code {code}); see {run_dir / 'logs'}",
            exit_code=code,
            reported=True,
            run_dir=run_dir,
            logs=run_dir / "logs",
        )
    return objective.read_objective(run_dir, str(cfg.objective)) if wants_objective and not cfg.dry_run else None


def _forward_or_note(cfg: DictConfig, run_dir: Path) -> None:
    """A dry run goes on here (its cluster checks over an open connection); a real one is validated and laid out
    here, then run by the cluster's hpc_train (raises Forwarded)."""
    if cfg.dry_run:
        forwarding.dry_run_commands(cfg)
        return
    auto_layout.check_before_forwarding(checked_view(cfg), run_dir)
    forwarding.run_on_cluster(cfg, run_dir, HydraConfig.get(), multirun=False)


def _exit_forwarded(forwarded: Forwarded) -> NoReturn:
    """The cluster's hpc-train ran the command and printed its words: its exit code, its refusal as data (the same
    family here: exits.from_data)."""
    if forwarded.refusal:
        write_result(exits.from_data(forwarded.refusal))
    sys.exit(forwarded.exit_code)


def _fail(err: BaseException, user_wants_traceback: bool) -> NoReturn:
    if exits.family_of(err) is not None:  # one of hpc_train.errors' families: its one message and exit code
        _end_on(err)  # type: ignore[arg-type]
    translated = translate(err, sys.argv[1:])
    if translated is not None:
        print(translated.message, file=sys.stderr)
        write_result(translated)
        sys.exit(EXIT_BAD_INPUT)
    if user_wants_traceback:
        raise err
    if isinstance(err, (CompactHydraException, HydraException)):  # Hydra's own words, as Hydra would print them
        words = f"hpc-train: {err}" + (f"\n{err.__cause__}" if err.__cause__ is not None else "")
        print(words, file=sys.stderr)
        write_result(CliWords(words))
        sys.exit(EXIT_BAD_INPUT)
    traceback.print_exception(type(err), err, err.__traceback__)
    sys.exit(1)


def _end_on(err: HpcTrainError) -> NoReturn:
    """The command's end on a family of hpc_train.errors (hpc_train.launch.hydra.exits): its one message (a failed job
    the launcher reported already says nothing more), a refusal as data for whoever started the command, its code."""
    if not (isinstance(err, JobFailed) and err.reported):
        print(exits.one_message(err), file=sys.stderr)
    if isinstance(err, exits.REFUSALS):
        write_result(err)
    sys.exit(exits.exit_code(err))


def main() -> None:
    """The command; a dry run, or a command refused before it wrote anything, leaves no run dir behind."""
    try:
        _main()
    except SystemExit as done:
        tidy_run_dir(done.code)
        raise
    tidy_run_dir(0)


def _main() -> None:
    user_wants_traceback = os.environ.get("HYDRA_FULL_ERROR") == "1"
    os.environ["HYDRA_FULL_ERROR"] = "1"  # Hydra re-raises instead of printing and exiting: we reword
    hydra_plugins.hpc_train_launcher.register()
    try:
        sys.argv[1:] = split_command_line(sys.argv[1:])  # `-- train.py ARGS`: the user's script (script.argv)
        sys.argv[1:] = rank_argv(sys.argv[1:])  # under torchrun: one run dir for all ranks (a no-op otherwise)
        sys.argv[1:] = whole_mappings(sys.argv[1:])  # cluster.extra={exclusive:true} adds its keys (++)
        # Decorated here, not at import: hydra.main sets Hydra's process-wide version base when it
        # decorates, and a process that only imports this module (a user's Hydra app, a test) keeps its own.
        hydra.main(version_base="1.3", config_path=CONFIG_DIR, config_name="config")(_task)()
    except Refused as refused:
        _fail(refused.error, user_wants_traceback)
    except Forwarded as forwarded:  # a sweep the cluster's hpc-train ran
        _exit_forwarded(forwarded)
    except Interrupted as interrupted:  # a KeyboardInterrupt said in one line (queueing, waiting): Hydra let it through
        if user_wants_traceback:
            raise
        print(interrupted, file=sys.stderr)
        sys.exit(interrupted.exit_code)
    except KeyboardInterrupt:  # anywhere else (composing, laying out a big sweep): what was queued says so itself
        if user_wants_traceback:
            raise
        print("hpc-train: interrupted (Ctrl-C)", file=sys.stderr)
        sys.exit(EXIT_CTRL_C)
    except Exception as err:
        _fail(err, user_wants_traceback)


if __name__ == "__main__":
    main()
