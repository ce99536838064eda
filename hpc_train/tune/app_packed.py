"""A Hydra app's adaptive study in packed allocations: ``hydra/launcher=hpc_train_slurm`` with
``hydra.launcher.pack.allocations`` set. Fed as hpc-train's studies are (hpc_train.tune.packed_trials.PackedTrials:
the allocations submitted once, each rung dropped into the feed), each rung a packed run whose job step runs the app's
task (hpc_train.pack.app_step), as a packed sweep of the app runs each job. A rung is job number n of the sweep (n: the
trial's number), so its output dir is ``<sweep dir>/<n>`` for every rung of the trial (an app that keeps its state
there resumes it when promoted), and its objective is the last value it reported there (app_trials.reported_value).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

import cloudpickle

from hpc_train.errors import ConfigError
from hpc_train.launch.hydra import app_launcher
from hpc_train.launch.hydra.app_task import SharedPart
from hpc_train.pack import app_step
from hpc_train.pack.records import PackedRun
from hpc_train.records import rundir
from hpc_train.tune.packed_trials import Allocations, PackedTrials, study_refusal

SHARED_FILE = "app_task_study.pkl"  # in <sweep dir>/.hpc_train: what every rung's task shares, pickled once


def app_packed_trials(launcher: Any, sweep_dir: Path, fixed: Sequence[str]) -> Optional[PackedTrials]:
    """The study's trials when the app's launcher packs (hydra.launcher.pack.allocations set, on Slurm); else None.
    A study whose rungs do not fit the allocations is refused as a packed sweep of the app is: one message, exit code
    2, nothing queued."""
    if not isinstance(launcher, app_launcher.AppLauncher) or launcher.backend.kind.on_this_machine:
        return None
    assert launcher.config is not None
    if launcher.config.hydra.launcher.get("pack", {}).get("allocations") is None:
        return None
    sweep_dir = Path(sweep_dir).absolute()
    try:
        return PackedTrials(AppRungs(launcher, sweep_dir, fixed), sweep_dir)
    except ConfigError as err:
        app_launcher.refuse(sweep_dir, err)


class AppRungs:
    """The app's rungs, laid out as the app launcher lays out a packed sweep's jobs."""

    def __init__(self, launcher: Any, sweep_dir: Path, fixed: Sequence[str]) -> None:
        self.launcher, self.sweep_dir = launcher, sweep_dir
        self.shared: Optional[SharedPart] = None  # pickled at the first rung, once the study starts
        first = launcher.app_job(SharedPart(sweep_dir / ".hpc_train" / SHARED_FILE), list(fixed), 0)
        shape = study_refusal(lambda: app_launcher.pack_shape(first.launcher), "0")
        assert shape is not None  # chosen only when hydra.launcher.pack.allocations is set
        template, params = study_refusal(lambda: app_launcher.packed_job(first, sweep_dir), "0")
        self.allocations = Allocations(
            shape,
            template,
            params,
            int(first.launcher.get("max_num_timeout") or 0),
            app_launcher.PACK_SIGNAL,
            int(first.launcher.get("signal_delay_s") or 0),
            app_launcher.APP_PACK_KEYS,
            app_launcher.APP_PACK_SHARED,
        )

    def lay_out(self, overrides: List[str], run_dir: Path, key: str) -> Tuple[PackedRun, Dict[str, Any]]:
        """The rung's task pickled into its packed run's folder, for its step (hpc_train.pack.app_step)."""
        if self.shared is None:
            self.shared = self.launcher.shared_part(self.sweep_dir / ".hpc_train" / SHARED_FILE)
        job = self.launcher.app_job(self.shared, overrides, int(run_dir.name))
        run, params = app_launcher.packed_job(job, self.sweep_dir, key)
        folder = Path(run.run_dir)
        folder.mkdir(parents=True, exist_ok=True)
        rundir.write_bytes_atomic(cloudpickle.dumps(job.task), folder / app_step.TASK_FILE)
        return run, params

    def logs(self, key: str, run_dir: Path) -> Path:
        return app_step.run_folder(self.sweep_dir, key) / rundir.SLURM_LOGS
