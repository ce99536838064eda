"""Hydra launcher for `hpc-train -m ...`: every Slurm job of a sweep gets its own layout.

Registered as hydra/launcher=hpc_train by hydra_plugins.hpc_train_launcher.

hydra-submitit-launcher builds one executor from `hydra.launcher` for the whole sweep, so
sweeping `strategy=ddp,pipeline` or `resources.gpus_per_node=2,4` cannot change --gres or
--ntasks-per-node per job. This launcher composes each job's config, validates and lays out
every job before anything is queued (one bad job: nothing submitted), groups jobs with
identical sbatch parameters into one job array, and saves a job table in the sweep dir.
Local jobs run one after another in this process, as with Hydra's basic launcher.
"""

from __future__ import annotations

import copy
import logging
import sys
from pathlib import Path
from typing import Any, List, Optional, Sequence

from hydra.core.hydra_config import HydraConfig
from hydra.core.utils import JobReturn, JobStatus, configure_log, filter_overrides, run_job, setup_globals
from hydra.plugins.launcher import Launcher
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, OmegaConf, open_dict

from hpc_train import rundir

log = logging.getLogger(__name__)

_MISSING = object()


class SweepLauncher(Launcher):
    def __init__(self) -> None:
        from hydra.core.override_parser.overrides_parser import OverridesParser

        self._parser = OverridesParser.create()
        self._groups: Optional[set] = None
        self._cache: dict = {}
        self.config: Optional[DictConfig] = None
        self.hydra_context: Optional[HydraContext] = None
        self.task_function: Optional[TaskFunction] = None

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        self.config, self.hydra_context, self.task_function = config, hydra_context, task_function

    def _job_config(self, overrides: Sequence[str], idx: int) -> DictConfig:
        """Compose one job's config.

        Hydra's full composition costs ~0.1 s a job, which dominates a 100-job sweep. Jobs that
        differ only in plain values (seed=3, trainer.lr=0.1) share one composition per set of
        config-group choices; the values are then set on a copy. Anything else (adding or
        deleting keys, packages, hydra.*) goes through Hydra's full composition.
        """
        assert self.hydra_context is not None and self.config is not None
        loader = self.hydra_context.config_loader
        parsed = self._parser.parse_overrides(list(overrides))
        groups = self._groups if self._groups is not None else set(loader.list_groups(""))
        self._groups = groups

        def structural(o) -> bool:
            return (
                o.is_add()
                or o.is_delete()
                or o.package is not None
                or o.key_or_group.split(".")[0] in groups
                or o.key_or_group.startswith("hydra")
            )

        base_overrides = [o.input_line for o in parsed if structural(o)]
        value_overrides = [o for o in parsed if not structural(o)]
        key = tuple(base_overrides)
        sweep_config = None
        if key not in self._cache:
            self._cache[key] = loader.load_sweep_config(self.config, base_overrides)
        try:
            sweep_config = copy.deepcopy(self._cache[key])
            for o in value_overrides:
                if OmegaConf.select(sweep_config, o.key_or_group, default=_MISSING) is _MISSING:
                    raise KeyError(o.key_or_group)
                OmegaConf.update(sweep_config, o.key_or_group, o.value(), merge=False)
            with open_dict(sweep_config):
                sweep_config.hydra.overrides.task = list(overrides)
        except Exception as err:  # let Hydra compose it and report the problem in its own words
            log.debug("full composition for %s: %r", list(overrides), err)
            sweep_config = loader.load_sweep_config(self.config, list(overrides))
        with open_dict(sweep_config):
            sweep_config.hydra.job.id = idx
            sweep_config.hydra.job.num = idx
        return sweep_config

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        setup_globals()
        assert self.config is not None and self.task_function is not None and self.hydra_context is not None
        configure_log(self.config.hydra.hydra_logging, self.config.hydra.verbose)
        sweep_dir = Path(str(self.config.hydra.sweep.dir))
        sweep_dir.mkdir(parents=True, exist_ok=True)
        configs = [self._job_config(o, initial_job_idx + i) for i, o in enumerate(job_overrides)]
        slurm_idx = [i for i, c in enumerate(configs) if c.launcher.name == "slurm"]
        returns: List[Optional[JobReturn]] = [None] * len(configs)
        if slurm_idx:
            for i, ret in zip(
                slurm_idx,
                self._submit([configs[i] for i in slurm_idx], [job_overrides[i] for i in slurm_idx], sweep_dir),
            ):
                returns[i] = ret
        for i, sweep_config in enumerate(configs):
            if returns[i] is None:
                # printed, not logged: Hydra reconfigures logging per job (this line's prefix would change after job #0)
                print(
                    f"hpc-train: sweep job #{sweep_config.hydra.job.num}:"
                    f" {' '.join(filter_overrides(job_overrides[i]))}",
                    flush=True,
                )
                returns[i] = run_job(
                    hydra_context=self.hydra_context,
                    task_function=self.task_function,
                    config=sweep_config,
                    job_dir_key="hydra.sweep.dir",
                    job_subdir_key="hydra.sweep.subdir",
                )
        if any(c.launcher.name != "slurm" for c in configs) and not configs[0].dry_run:
            print(f"hpc-train: sweep dir {sweep_dir}; compare its jobs with: hpc-train-report {sweep_dir}")
        return returns  # type: ignore[return-value]

    def _submit(self, configs: List[DictConfig], overrides: List[Sequence[str]], sweep_dir: Path) -> List[JobReturn]:
        """Validate, submit and (when asked, or when the sweeper optimises) follow this batch's Slurm jobs.

        Under hpc-train's own sweeper one bad job stops the whole sweep before anything is
        queued. Under a sweeper that reads return values (Optuna, ...) each trial stands alone:
        a trial whose sampled values fail validation, or whose job fails, comes back FAILED and
        the sweeper decides (hydra.sweeper.max_failure_rate).
        """
        from hpc_train.launch import slurm
        from hpc_train.launch.errors import ConfigError, JobFailed
        from hpc_train.launch.jobspec import build_job_spec, write_job_spec
        from hpc_train.launch.objective import read_objective, sweeper_wants_objective
        from hpc_train.launch.plan import make_plan
        from hpc_train.launch.run import follow

        assert self.config is not None
        optimising = sweeper_wants_objective(self.config.hydra)
        returns: List[Optional[JobReturn]] = [None] * len(configs)
        prepared = []
        for i, (sweep_config, job_overrides) in enumerate(zip(configs, overrides)):
            HydraConfig.instance().set_config(sweep_config)
            run_dir = Path(str(sweep_config.hydra.sweep.dir)) / str(sweep_config.hydra.sweep.subdir)
            label = " ".join(filter_overrides(job_overrides))
            try:
                plan = make_plan(sweep_config, run_dir)
                prepared.append((i, slurm.prepare(sweep_config, plan, build_job_spec(sweep_config, plan), label)))
            except ConfigError as err:
                if optimising:
                    print(
                        f"hpc-train: trial #{sweep_config.hydra.job.num} ({label}) not submitted: {err.message}",
                        file=sys.stderr,
                    )
                    returns[i] = _job_return(sweep_config, job_overrides, err)
                    continue
                raise ConfigError(
                    err.key,
                    f"sweep job #{sweep_config.hydra.job.num} ({label}): {err.problem} Because of it, nothing was"
                    " submitted.",
                    err.fix,
                ) from None
        if configs[0].dry_run:
            for _, job in prepared:
                print(f"#{job.plan.run_dir.name} {job.label}: {job.plan.layout.describe()}")
            return [_job_return(c, o, None) for c, o in zip(configs, overrides)]
        if not prepared:
            return returns  # type: ignore[return-value]
        # Submitted first: a refused sbatch leaves no job_config.yaml that a later resume would misread
        # (the ranks read the spec submitit pickled; job_config.yaml is the readable record).
        submitted = slurm.submit_jobs([job for _, job in prepared], log_root=sweep_dir)
        for i, job in prepared:
            write_job_spec(job.spec, job.plan.run_dir)
            hydra_dir = job.plan.run_dir / ".hydra"
            hydra_dir.mkdir(parents=True, exist_ok=True)
            (hydra_dir / "overrides.yaml").write_text(OmegaConf.to_yaml(OmegaConf.create(list(overrides[i]))))
        handles = {id(job): handle for job, handle in submitted}
        rows = [
            (str(handles[id(job)].job_id), job.plan.run_dir.name, job.label, job.plan.layout.describe())
            for _, job in prepared
        ]
        _print_table(rows, sweep_dir / rundir.JOB_TABLE)
        if optimising or configs[0].launcher.wait:
            if optimising:
                print(
                    f"hpc-train: waiting for this batch of {len(prepared)} job(s): the sweeper needs their"
                    f" {configs[0].objective}"
                )
            for i, job in prepared:
                handle = handles[id(job)]
                code = follow(handle, job.plan.run_dir)
                if not optimising:
                    returns[i] = _job_return(configs[i], overrides[i], handle.job_id)
                elif code != 0:
                    returns[i] = _job_return(
                        configs[i],
                        overrides[i],
                        JobFailed(f"Slurm job {handle.job_id} failed; see {job.plan.run_dir / 'logs'}"),
                    )
                else:
                    try:
                        returns[i] = _job_return(
                            configs[i], overrides[i], read_objective(job.plan.run_dir, str(configs[i].objective))
                        )
                    except JobFailed as err:
                        returns[i] = _job_return(configs[i], overrides[i], err)
        for i, job in prepared:
            if returns[i] is None:
                returns[i] = _job_return(configs[i], overrides[i], handles[id(job)].job_id)
        return returns  # type: ignore[return-value]


def _job_return(sweep_config: DictConfig, overrides: Sequence[str], value: Any) -> JobReturn:
    """A finished trial: COMPLETED with `value` (job id or objective), FAILED when `value` is an exception."""
    ret = JobReturn()
    ret.overrides = list(overrides)
    ret.cfg = sweep_config
    ret.hydra_cfg = sweep_config
    ret.working_dir = str(Path(str(sweep_config.hydra.sweep.dir)) / str(sweep_config.hydra.sweep.subdir))
    ret.task_name = "hpc-train"
    ret.status = JobStatus.FAILED if isinstance(value, BaseException) else JobStatus.COMPLETED
    ret.return_value = value
    return ret


def _print_table(rows: List[tuple], path: Path) -> None:
    """Print this batch's jobs and append them to the sweep's job table (a sweeper may send several batches)."""
    header = ("job_id", "job", "overrides", "layout")
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    lines = ["  ".join(str(v).ljust(w) for v, w in zip(row, widths)).rstrip() for row in [header, *rows]]
    print("\n".join(lines))
    new_table = not path.exists()
    with path.open("a") as table:
        table.write(
            "".join("\t".join(str(v) for v in row) + "\n" for row in ([header] if new_table else []) + list(rows))
        )
    print(f"hpc-train: job table {'saved to' if new_table else 'extended in'} {path}")
